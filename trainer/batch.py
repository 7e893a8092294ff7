"""Many runs of one workshop trained together, as one batched numpy computation: the backtest's trainer.

Every (seed, incident) run is a lane. The healthy prefix of every seed steps together up to the
onset; there each seed forks into its incidents, and all lanes step together to the end. For
the backtest's 100 seeds x 5 incidents that is 600 batched steps instead of 270,000 small ones.

The lanes are, bit for bit, the runs `trainer.run.Trainer` computes (tests/test_batch.py checks a
sample against `runwatch train --offline`): each batched operation does, lane by lane, the same
floating-point operations in the same order as the one-run code. Stacked matmuls call the same
BLAS routine once per lane, reductions run along the same contiguous axes, and what is not
elementwise (the weight norm's BLAS dot, the curve fit, the random draws) runs per lane with the
one-run functions themselves.

Not for live runs (`trainer.live`), and not batched in fp16 or over several ranks: the loss
scaler skips steps run by run, and ranks split each batch, so `train_many` trains those runs one
at a time, each incident forked from its seed's prefix.

    >>> runs = train_many([TrainConfig(seed=1), TrainConfig(seed=1, incident="lr_spike")])
    >>> runs[1][300].lr
    15.0
"""

from __future__ import annotations

import dataclasses

import numpy as np

from runwatch.trainer import model
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.record import Columns, StepRecord
from runwatch.trainer.run import (
    Trainer,
    arithmetic,
    batch_source,
    corrupt_labels,
    draw_batch,
    expected_loss,
    fit_expected,
    heldout_set,
    incident_active,
    learning_rate,
    step_durations,
    weight_norm,
)


def train_many(configs: list[TrainConfig]) -> list[list[StepRecord]]:
    """Every config's whole run, in order. The configs may differ only in seed and incident (and
    its strength)."""
    return [run.records() for run in train_columns(configs)]


def train_columns(configs: list[TrainConfig]) -> list[Columns]:
    """train_many's runs, field by field (trainer.record.Columns): the batched runs are never
    made into records, one per step, for the offline writer only to take them apart again."""
    if not configs:
        return []
    base = _healthy(configs[0], seed=0)
    for cfg in configs:
        cfg.validate()
        if _healthy(cfg, seed=0) != base:
            raise ValueError("train_many: the configs may differ only in seed, incident and strength")
    if base.precision == "fp16" or base.ranks > 1:  # the loss scaler branches per run; ranks split the batch
        return [Columns.of(records) for records in _one_by_one(configs)]
    seeds = sorted({c.seed for c in configs})
    healthy = [dataclasses.replace(base, seed=s) for s in seeds]
    means = model.class_means(base)
    prefix = _Lanes.start(healthy, means)
    head = prefix.run(0, base.onset)
    # From the onset, one lane per seed and arithmetic: a slow node's weights are the healthy
    # run's (only its clock differs), so both runs read one lane.
    kinds = {_kind(c) for c in configs}
    of_incident = {k: arithmetic(dataclasses.replace(base, incident=k[0], strength=k[1])) for k in kinds}
    lanes: dict[tuple, int] = {}
    lane_of = [lanes.setdefault((c.seed, of_incident[_kind(c)]), len(lanes)) for c in configs]
    firsts = {lane: c for c, lane in reversed(list(zip(configs, lane_of, strict=True)))}
    tail = prefix.fork([firsts[i] for i in range(len(lanes))], configs, lane_of).run(base.onset, base.steps)
    row = {s: i for i, s in enumerate(seeds)}
    return [head[row[c.seed]] + tail[i] for i, c in enumerate(configs)]


def _healthy(cfg: TrainConfig, **changes) -> TrainConfig:
    """cfg without its incident: the run its prefix is."""
    return dataclasses.replace(cfg, incident="none", strength=1.0, **changes)


def _kind(cfg: TrainConfig) -> tuple[str, float]:
    """What of a config the incident's arithmetic and clock follow from: the incident and its strength."""
    return cfg.incident, cfg.strength


def _one_by_one(configs: list[TrainConfig]) -> list[list[StepRecord]]:
    """Each seed's healthy prefix once, forked at the onset into each of its configs."""
    heads: dict[int, tuple[Trainer, list[StepRecord]]] = {}
    out = []
    for cfg in configs:
        if cfg.seed not in heads:
            prefix = Trainer(_healthy(cfg))
            heads[cfg.seed] = prefix, [prefix.step() for _ in range(cfg.onset)]
        prefix, head = heads[cfg.seed]
        out.append(head + prefix.fork(cfg).run())
    return out


class _Lanes:
    """Many runs at one step. The arithmetic (weights, held-out loss, fit) is kept per lane,
    lanes[j]; the clock per run, runs[i], which reads lane lane_of[i]."""

    def __init__(self, lanes: list[TrainConfig], runs: list[TrainConfig], lane_of: list[int], means: np.ndarray):
        self.lanes, self.runs, self.lane_of, self.means = lanes, runs, lane_of, means
        # one config of each incident and strength: the learning rate and the incident follow from them alone
        self.incidents = {_kind(c): c for c in lanes + runs}
        # Trainer adds each step's duration to its clock in turn; add.accumulate does the same adds
        self.durations = np.stack([step_durations(c) for c in runs])
        self.lab_time = np.add.accumulate(self.durations, axis=1)

    @classmethod
    def start(cls, configs: list[TrainConfig], means: np.ndarray) -> _Lanes:
        """One lane per config, at step 0."""
        lanes = cls(configs, configs, list(range(len(configs))), means)
        cfg, n = configs[0], len(configs)
        lanes.w = np.zeros((n, cfg.features, cfg.classes))
        lanes.b = np.zeros((n, cfg.classes))
        heldout = [heldout_set(c, means) for c in configs]
        lanes.heldout_x = np.stack([x for x, _ in heldout])
        lanes.heldout_y = np.stack([y for _, y in heldout])
        lanes.heldout_loss = np.full(n, np.nan)
        lanes.fit_losses = np.zeros((n, max(0, cfg.fit_end - cfg.fit_start)))
        lanes.fits: list[tuple[float, float, float] | None] = [None] * n
        return lanes

    def fork(self, lanes: list[TrainConfig], runs: list[TrainConfig], lane_of: list[int]) -> _Lanes:
        """Lanes that go on under `lanes`, each from this object's lane of its seed (a seed into
        its incidents), read by `runs`."""
        rows = [next(j for j, c in enumerate(self.lanes) if c.seed == lane.seed) for lane in lanes]
        other = _Lanes(lanes, runs, lane_of, self.means)
        other.w, other.b = self.w[rows], self.b[rows]  # fancy indexing copies
        other.heldout_x, other.heldout_y = self.heldout_x[rows], self.heldout_y[rows]
        other.heldout_loss = self.heldout_loss[rows]
        other.fit_losses = self.fit_losses[rows]
        other.fits = [self.fits[r] for r in rows]
        return other

    def _batches(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Every lane's (x, y) at this step: one draw per seed and source step, shared by its incidents."""
        drawn: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        xs, ys = [], []
        for cfg in self.lanes:
            key = (cfg.seed, batch_source(cfg, step))
            if key not in drawn:
                drawn[key] = draw_batch(cfg, self.means, key[1])
            x, y = drawn[key]
            xs.append(x)
            ys.append(corrupt_labels(cfg, step, y))
        return np.stack(xs), np.stack(ys)

    def run(self, start: int, stop: int) -> list[Columns]:
        """Steps [start, stop) of every lane; each run's, field by field."""
        cfg0 = self.lanes[0]
        lanes = np.arange(len(self.lanes))[:, None]
        # each step's value of every lane, and of every incident
        losses, heldout, grad_norms, lrs, weight_norms, expected, all_logits = [], [], [], [], [], [], []
        active: dict[tuple[str, float], list[bool]] = {i: [] for i in self.incidents}
        for s in range(start, stop):
            # --- batch, forward, backward (model.forward_backward, lane by lane) ---
            x, y = self._batches(s)
            rows = np.arange(y.shape[1])[None, :]
            logits = np.matmul(x, self.w) + self.b[:, None, :]
            logp = log_softmax_by_class(logits)  # (classes, lanes, examples)
            loss = -logp[y, lanes, rows].mean(axis=1)
            delta = np.ascontiguousarray(np.moveaxis(np.exp(logp), 0, -1))  # back to (lanes, examples, classes)
            delta[lanes, rows, y] -= 1.0
            delta /= y.shape[1]
            g_w, g_b = np.matmul(x.transpose(0, 2, 1), delta), delta.sum(axis=1)
            # --- held-out evaluation, on the same weights as this step's training loss ---
            if s % cfg0.heldout_every == 0:
                held = log_softmax_by_class(np.matmul(self.heldout_x, self.w) + self.b[:, None, :])
                examples = np.arange(self.heldout_y.shape[1])[None, :]
                self.heldout_loss = -held[self.heldout_y, lanes, examples].mean(axis=1)
            # --- update (the learning rate and the incident follow from the incident and its strength alone) ---
            lr_of = {i: learning_rate(c, s) for i, c in self.incidents.items()}
            lr = np.array([lr_of[_kind(c)] for c in self.lanes])
            grad_norm = np.sqrt((g_w * g_w).sum(axis=(1, 2)) + (g_b * g_b).sum(axis=1))
            self.w -= lr[:, None, None] * g_w
            self.b -= lr[:, None] * g_b
            # --- Lesson 20's signals ---
            if cfg0.fit_start <= s < cfg0.fit_end:
                self.fit_losses[:, s - cfg0.fit_start] = loss
                if s == cfg0.fit_end - 1:
                    self.fits = [fit_expected(c, self.fit_losses[j]) for j, c in enumerate(self.lanes)]
            # --- what the step recorded, lane by lane ---
            losses.append(loss)
            heldout.append(self.heldout_loss)
            grad_norms.append(grad_norm)
            lrs.append(lr)
            weight_norms.append([weight_norm(w, b) for w, b in zip(self.w, self.b, strict=True)])
            expected.append([expected_loss(fit, s) for fit in self.fits])
            all_logits.append(logits)
            for i, c in self.incidents.items():
                active[i].append(incident_active(c, s))
        per_step = [losses, heldout, grad_norms, lrs, weight_norms, expected]
        return self._columns(start, stop, per_step, all_logits, active)

    def _columns(
        self, start: int, stop: int, per_step: list[list], logits: list[np.ndarray], active: dict[tuple, list[bool]]
    ) -> list[Columns]:
        """Each run's columns over [start, stop): its lane's arithmetic (per_step: loss, held-out
        loss, gradient norm, learning rate, weight norm, expected loss, each a lane vector per
        step), on its own clock."""
        n = stop - start
        if n <= 0:  # an onset at step 0: no prefix
            return [Columns.of([]) for _ in self.runs]
        by_lane = [np.array(v).T.tolist() for v in per_step]
        by_lane.append([[step[j] for step in logits] for j in range(len(self.lanes))])
        durations, lab_time = self.durations[:, start:stop].tolist(), self.lab_time[:, start:stop].tolist()
        out = []
        for i, (c, j) in enumerate(zip(self.runs, self.lane_of, strict=True)):
            loss_, held_, norm_, lr_, weight_, expected_, logits_ = (lists[j] for lists in by_lane)
            out.append(Columns(
                step=list(range(start, stop)), loss=loss_, heldout_loss=held_, gradient_norm=norm_, lr=lr_,
                duration_seconds=durations[i], tokens=[c.batch_size * c.tokens_per_example] * n,
                incident_active=active[_kind(c)], lab_time=lab_time[i], weight_norm=weight_, expected_loss=expected_,
                loss_scale=[float("nan")] * n, skipped=[False] * n, logits=logits_,
            ))  # fmt: skip
        return out


# numpy adds a row of up to this many in one block: eight running sums, then the rest one by one
_PAIRWISE_BLOCK = 128


def log_softmax_by_class(logits: np.ndarray) -> np.ndarray:
    """model.log_softmax of a stack (..., classes), computed on planes, one per class: returned
    with the classes first, (classes, ...).

    The same operations as model.log_softmax, in the same order: the row maximum, the shift, the
    exponentials, their row sum as numpy's add.reduce takes it over a short contiguous row (eight
    running sums combined pairwise, then the rest in turn; sequential below eight), the log.
    Done elementwise across class planes instead of along rows of ten, it is about twice as fast
    at a backtest's shapes. tests/test_batch.py checks it equals model.log_softmax, bit for bit.
    """
    n = logits.shape[-1]
    if n > _PAIRWISE_BLOCK:  # numpy splits longer rows recursively: use its own reduction
        return np.moveaxis(model.log_softmax(logits), -1, 0)
    planes = np.ascontiguousarray(np.moveaxis(logits, -1, 0))
    z = planes - np.maximum.reduce(planes, axis=0)
    e = np.exp(z)
    if n < 8:
        total = e[0]
        for k in range(1, n):
            total = total + e[k]
    else:
        sums = list(e[:8])
        k = 8
        while k < n - n % 8:
            sums = [sums[j] + e[k + j] for j in range(8)]
            k += 8
        total = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]))
        for rest in range(k, n):
            total = total + e[rest]
    return z - np.log(total)

"""One training run of the workshop, a step at a time, with the incident injected.

Every random draw comes from a generator seeded by (seed, stream, step), so a step's batch,
shuffle and jitter do not depend on what ran before it: the same seed gives the same series
bit for bit, and an incident run shares its healthy prefix with the `none` run of its seed.

This module does no sleeping and no exporting; `trainer.live` and `trainer.offline` do.

    >>> t = Trainer(TrainConfig(incident="corrupt_shard"))
    >>> rec = t.step()          # step 0
    >>> rec.step, rec.loss > 0
    (0, True)
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np

from runwatch.core.files import write_atomic
from runwatch.trainer import model, parallel
from runwatch.trainer.config import FAULTS, TrainConfig
from runwatch.trainer.record import StepRecord
from runwatch.trainer.sealed import is_sealed, seal_text, unseal_text

# Independent random streams; their numbers are part of the data's definition.
_BATCH, _HELDOUT, _JITTER, _SHUFFLE, _CLUSTER = 0, 1, 2, 3, 4


def _rng(cfg: TrainConfig, stream: int, step: int = 0) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, stream, step])


# How long each incident lasts: the config field (or property, at the incident's strength) that
# says, or the whole run from the onset.
_LENGTH = {"lr_spike": "lr_spike_steps", "corrupt_shard": "corrupt_steps", "repeated_batch": "repeats",
           "slow_node": "steps", "straggler": "steps"}  # fmt: skip


def incident_active(cfg: TrainConfig, step: int) -> bool:
    """Whether the configured incident acts on this step (a fault: from its strike on)."""
    if cfg.incident in FAULTS:
        return step >= fault_step(cfg)
    field = _LENGTH.get(cfg.incident)
    return field is not None and cfg.onset <= step < cfg.onset + getattr(cfg, field)


def learning_rate(cfg: TrainConfig, step: int) -> float:
    if cfg.incident == "lr_spike" and incident_active(cfg, step):
        return cfg.lr * cfg.spike_factor
    return cfg.lr


def struck_rank(cfg: TrainConfig) -> int:
    """The rank a cluster incident strikes, drawn from the seed."""
    return int(_rng(cfg, _CLUSTER).integers(cfg.ranks))


def fault_step(cfg: TrainConfig) -> int:
    """The step a hang, crash or ECC error strikes (trainer.faults): 1 to checkpoint_every-1 steps
    after the onset, drawn from the seed, so the steps a restart loses vary from run to run."""
    offset = int(_rng(cfg, _CLUSTER, 1).integers(1, max(2, cfg.checkpoint_every)))
    return min(cfg.onset + offset, cfg.steps - 1)


def compute_seconds(cfg: TrainConfig) -> np.ndarray:
    """Device seconds each rank computes at each step, (ranks, steps): nominal, times lognormal
    jitter, slower on a slow node (every rank) or for a straggler (its rank only).

    Rank r draws in one go from jitter stream r, so the jitter does not depend on the incident;
    rank 0's is the one-process run's.
    """
    streams = [_rng(cfg, _JITTER, r).lognormal(0.0, cfg.jitter_sigma, size=cfg.steps) for r in range(cfg.ranks)]
    seconds = cfg.step_seconds * np.stack(streams)
    if cfg.incident == "slow_node":
        seconds[:, cfg.onset :] /= cfg.throughput_factor
    if cfg.incident == "straggler":
        seconds[struck_rank(cfg), cfg.onset :] /= cfg.clock_factor
    return seconds


def step_durations(cfg: TrainConfig) -> np.ndarray:
    """Device seconds for every step of the job: one rank's compute; over several ranks, the
    slowest rank's, then the gradient exchange (trainer.cluster)."""
    seconds = compute_seconds(cfg)
    if cfg.ranks == 1:
        return seconds[0]
    return seconds.max(axis=0) + cfg.collective_seconds


def batch_source(cfg: TrainConfig, step: int) -> int:
    """Which step's draw is trained on at this step: its own, or the onset's on a repeated batch."""
    if cfg.incident == "repeated_batch" and incident_active(cfg, step):
        return cfg.onset  # the onset's batch, fed again and again
    return step


def draw_batch(cfg: TrainConfig, means: np.ndarray, source: int) -> tuple[np.ndarray, np.ndarray]:
    """The clean batch drawn for step `source`: the same for every incident of a seed."""
    return model.sample(_rng(cfg, _BATCH, source), means, cfg.batch_size, cfg.noise)


def shuffles_labels(cfg: TrainConfig, step: int) -> bool:
    """Whether this step reads a corrupt shard, whose labels are shuffled."""
    return cfg.incident == "corrupt_shard" and incident_active(cfg, step)


def corrupt_labels(cfg: TrainConfig, step: int, y: np.ndarray) -> np.ndarray:
    """The labels trained on at this step: while a corrupt shard is read, all shuffled, or below
    full strength a share of them (round(strength x batch), at the positions drawn) shuffled
    among themselves."""
    if not shuffles_labels(cfg, step):
        return y
    rng = _rng(cfg, _SHUFFLE, step)
    k = round(cfg.strength * len(y))
    if k >= len(y):  # the plate's: the whole batch, as it always was
        return rng.permutation(y)
    where = np.sort(rng.choice(len(y), size=k, replace=False))
    out = y.copy()
    out[where] = y[where][rng.permutation(k)]
    return out


def arithmetic(cfg: TrainConfig) -> tuple:
    """Everything of the incident that a step's arithmetic reads, step by step from the onset:
    which batch, shuffled or not (and how much), at which learning rate. Two incidents with the same arithmetic
    (a slow node and none: only the clock differs) train the same weights, bit for bit."""
    return tuple(
        (batch_source(cfg, s), shuffles_labels(cfg, s) and cfg.strength, learning_rate(cfg, s))
        for s in range(cfg.onset, cfg.steps)
    )


def get_batch(cfg: TrainConfig, means: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch trained on at this step, with the incident's corruption applied."""
    x, y = draw_batch(cfg, means, batch_source(cfg, step))
    return x, corrupt_labels(cfg, step, y)


def heldout_set(cfg: TrainConfig, means: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fixed held-out examples of a seed, never trained on."""
    return model.sample(_rng(cfg, _HELDOUT), means, cfg.heldout_size, cfg.noise)


def fit_expected(cfg: TrainConfig, losses: np.ndarray) -> tuple[float, float, float]:
    """Lesson 20's expected curve: the power law fitted to the training loss of the fit window."""
    return model.fit_power_law(np.arange(cfg.fit_start, cfg.fit_end) + 1.0, losses)


def expected_loss(fit: tuple[float, float, float] | None, step: int) -> float:
    """The fitted curve at this step; NaN until the fit window has passed."""
    return float("nan") if fit is None else fit[0] * (step + 1.0) ** -fit[1] + fit[2]


def weight_norm(w: np.ndarray, b: np.ndarray) -> float:
    """Lesson 20's weight norm: the L2 norm of all parameters. vdot flattens without a copy; on
    the hot path numpy's per-call overhead is most of the cost."""
    return math.sqrt(float(np.vdot(w, w)) + float(np.vdot(b, b)))


class NonFiniteCheckpointError(ValueError):
    """A checkpoint whose weights hold NaN or inf: a run that diverged, or damaged bytes."""


class Trainer:
    """Holds the weights and the clock; `step()` advances one step.

    Use `trainer.live` to run it paced and exported, `trainer.offline` to write a whole run.
    """

    def __init__(self, cfg: TrainConfig):
        cfg.validate()
        self.cfg = cfg
        self.means = model.class_means(cfg)
        self.heldout = heldout_set(cfg, self.means)
        self.durations = step_durations(cfg)
        dtype = np.float32 if cfg.precision == "fp16" else np.float64  # fp16 keeps float32 master weights
        self.w = np.zeros((cfg.features, cfg.classes), dtype)
        self.b = np.zeros(cfg.classes, dtype)
        self.next_step = 0
        self.lab_time = 0.0
        self.heldout_loss = float("nan")
        self.grad_norm = 0.0  # of the last step's gradient
        self.scale = cfg.loss_scale_init if cfg.precision == "fp16" else float("nan")
        self.clean_steps = 0  # since the scale last changed (GradScaler's growth tracker)
        self.skipped_steps = 0
        self.fit_losses: list[float] = []
        self.fit: tuple[float, float, float] | None = None  # (a, b, c) once the window has passed

    @property
    def done(self) -> bool:
        return self.next_step >= self.cfg.steps

    # Why the run stops before its end, once it must ("drained": a rank of a cluster job whose
    # node is taken out at this checkpoint, trainer.rank); None while it goes on.
    halted: str | None = None

    def _forward_backward(self, x: np.ndarray, y: np.ndarray, scale: float):
        if self.cfg.precision == "fp16":
            return model.forward_backward_fp16(self.w, self.b, x, y, scale)
        if self.cfg.ranks == 1:
            return model.forward_backward(self.w, self.b, x, y)
        return parallel.combine(self.exchange(x, y))

    def exchange(self, x: np.ndarray, y: np.ndarray) -> list[parallel.Part]:
        """Every rank's part of this step's gradient, in rank order. Here all ranks are simulated
        in this process; a live rank (trainer.rank) computes its own and gathers the others."""
        return [parallel.share_gradient(self.w, self.b, x, y, self.cfg, r) for r in range(self.cfg.ranks)]

    def step(self) -> StepRecord:
        cfg, s = self.cfg, self.next_step
        # --- batch, forward, backward ---
        x, y = get_batch(cfg, self.means, s)
        loss, g_w, g_b, logits = self._forward_backward(x, y, self.scale)
        scale = self.scale
        # --- held-out evaluation, on the same weights as this step's training loss ---
        if s % cfg.heldout_every == 0:
            evaluate = model.loss_fp16 if cfg.precision == "fp16" else model.loss
            self.heldout_loss = evaluate(self.w, self.b, *self.heldout)
        # --- update, unless float16 overflowed: then the loss scaler skips it and backs off ---
        lr = learning_rate(cfg, s)
        skipped = cfg.precision == "fp16" and not (np.isfinite(g_w).all() and np.isfinite(g_b).all())
        if skipped:  # float16 overflowed; the monitor still wants the gradient's size, so take it in float64
            _, g_w, g_b, _ = model.forward_backward(self.w.astype(np.float64), self.b.astype(np.float64), x, y)
        self.grad_norm = float(np.sqrt(np.sum(g_w * g_w) + np.sum(g_b * g_b)))
        if not skipped:
            self.w -= lr * g_w
            self.b -= lr * g_b
        if cfg.precision == "fp16":
            self._update_scale(skipped)
        # --- Lesson 20's signals ---
        if cfg.fit_start <= s < cfg.fit_end:
            self.fit_losses.append(loss)
            if s == cfg.fit_end - 1:
                self.fit = fit_expected(cfg, np.array(self.fit_losses))
        expected = expected_loss(self.fit, s)
        # --- the clock ---
        duration = float(self.durations[s])
        self.lab_time += duration
        self.next_step += 1
        return StepRecord(
            step=s,
            loss=loss,
            heldout_loss=self.heldout_loss,
            gradient_norm=self.grad_norm,
            lr=lr,
            duration_seconds=duration,
            tokens=cfg.batch_size * cfg.tokens_per_example,
            incident_active=incident_active(cfg, s),
            lab_time=self.lab_time,
            weight_norm=weight_norm(self.w, self.b),
            expected_loss=expected,
            loss_scale=scale,
            skipped=skipped,
            logits=logits,  # its norms are computed when read, off the step (trainer.record)
        )

    def _update_scale(self, found_inf: bool) -> None:
        """GradScaler.update(): back off on overflow, grow after enough clean steps."""
        if found_inf:
            self.scale *= 0.5
            self.clean_steps = 0
            self.skipped_steps += 1
        else:
            self.clean_steps += 1
            if self.clean_steps == self.cfg.loss_scale_growth_interval:
                self.scale *= 2.0
                self.clean_steps = 0

    # --- checkpoints ---

    def save_checkpoint(self, folder: Path) -> Path:
        """Write checkpoint-<step>.npz (the state after step next_step-1) and keep the newest M."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"checkpoint-{self.next_step - 1:06d}.npz"
        buffer = io.BytesIO()
        # A drill's checkpoint holds its config sealed, as answer.sealed does, and only its
        # owner may read it: `np.load(f)["config"]` must not name the hidden incident.
        config = seal_text(json.loads(self.cfg.to_json())) if self.cfg.drill else self.cfg.to_json()
        np.savez(
            buffer, config=np.array(config), w=self.w, b=self.b, fit_losses=np.array(self.fit_losses),
            fit=np.array(self.fit if self.fit else []),
            scalars=np.array([self.next_step, self.lab_time, self.heldout_loss, self.grad_norm, self.scale,
                              self.clean_steps, self.skipped_steps]),
        )  # fmt: skip
        write_atomic(path, buffer.getvalue(), mode=0o600 if self.cfg.drill else 0o644)
        for old in sorted(folder.glob("checkpoint-*.npz"))[: -self.cfg.checkpoint_keep]:
            old.unlink()
        return path

    @classmethod
    def from_checkpoint(cls, path: Path) -> Trainer:
        """The trainer as it was when `path` was saved: the same series follow, bit for bit."""
        with np.load(path, allow_pickle=False) as data:
            config = str(data["config"])
            if is_sealed(config):
                config = json.dumps(unseal_text(config, str(path)))
            trainer = cls(TrainConfig.from_json(config, source=str(path)))
            trainer._restore(data, path)
        return trainer

    @staticmethod
    def position(path: Path) -> tuple[int, float]:
        """(the last step a checkpoint holds, the lab time after it), without loading the run."""
        with np.load(path, allow_pickle=False) as data:
            step, lab = data["scalars"].tolist()[:2]
        return int(step) - 1, lab

    def restore(self, path: Path) -> None:
        """Go back to the state saved at `path`, a checkpoint of this very run (a rank of a
        restarted job, trainer.rank): the same series follow, bit for bit."""
        with np.load(path, allow_pickle=False) as data:
            self._restore(data, path)

    def _restore(self, data, path: Path) -> None:
        cfg = self.cfg
        self.w, self.b = data["w"].copy(), data["b"].copy()
        shapes, fits = (self.w.shape, self.b.shape), ((cfg.features, cfg.classes), (cfg.classes,))
        if shapes != fits:
            raise ValueError(f"{path}: weights of shapes {shapes} do not fit its config's {fits}")
        if not (np.isfinite(self.w).all() and np.isfinite(self.b).all()):  # it would train "loss nan" silently
            raise NonFiniteCheckpointError(f"{path}: its weights are not finite (NaN or inf); resume an earlier one")
        with np.errstate(all="ignore"):  # finite weights can overflow the logits: w[0,0]=1e308 trained "loss nan" too
            heldout = model.loss(self.w, self.b, *self.heldout)
        if not math.isfinite(heldout):
            raise NonFiniteCheckpointError(
                f"{path}: its weights give a loss that is not finite ({heldout}: they overflow); resume an earlier one"
            )
        self.fit_losses = [float(v) for v in data["fit_losses"]]
        self.fit = tuple(float(v) for v in data["fit"]) if len(data["fit"]) else None
        step, lab, heldout, grad, scale, clean, skipped = data["scalars"].tolist()
        self.next_step, self.lab_time, self.heldout_loss = int(step), lab, heldout
        self.grad_norm, self.scale, self.clean_steps, self.skipped_steps = grad, scale, int(clean), int(skipped)

    def retarget(self, cfg: TrainConfig) -> Trainer:
        """This trainer, going on under another config (a resumed run with a lower learning rate,
        or without its incident). The clock, data and weights stay."""
        cfg.validate()
        other = copy.deepcopy(self)
        other.cfg = cfg
        other.durations = step_durations(cfg)
        return other

    def move_onset(self, onset: int) -> None:
        """Take the incident from `onset` instead, this run going on healthy until then (the live
        clock's watcher, trainer.live: the alerts' baselines were not ready at the old onset).
        Before the onset every incident trains as the healthy run does, so the steps so far
        stand; a step's clock and data from the new onset on are those of a run configured so."""
        if onset < self.next_step:
            raise ValueError(f"move_onset: step {onset} is already trained (next step {self.next_step})")
        self.cfg = dataclasses.replace(self.cfg, onset=onset)
        self.cfg.validate()
        self.durations = step_durations(self.cfg)

    def fork(self, cfg: TrainConfig) -> Trainer:
        """A copy of this trainer that goes on under cfg, which may differ only in its incident
        (and the incident's strength).

        Before the onset every incident trains exactly as the healthy run does, so a backtest
        trains the shared prefix once per seed and forks it for each incident.
        """
        cfg.validate()
        if dataclasses.replace(cfg, incident=self.cfg.incident, strength=self.cfg.strength) != self.cfg:
            raise ValueError("fork: the configs may differ only in their incident")
        if self.next_step > cfg.onset:
            raise ValueError(f"fork: step {self.next_step} is past the onset {cfg.onset}")
        return self.retarget(cfg)

    def run(self) -> list[StepRecord]:
        """Every remaining step, unpaced."""
        out = []
        while not self.done:
            out.append(self.step())
        return out

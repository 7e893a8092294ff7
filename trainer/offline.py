"""Whole runs at full speed, written as timestamped OpenMetrics text for promtool to backfill.

The file holds what a 1 s scrape of the live exporter would have stored: the same metric
names and `run_id` label, plus the target labels `job="trainer"` and one `instance` per run,
and `up` = 1. Step s is stamped at the end of step s on the lab clock (start + the simulated
device time of steps 0..s), so slow-node steps are 1/0.7 s apart. The step-duration histogram
is left out; tokens per second carries the same information.

Not for live runs: `trainer.live` paces and exports.

    >>> runs = [simulate(TrainConfig(incident="slow_node", seed=1))]
    >>> with open("run.om", "w") as fh:
    ...     write_openmetrics(runs, fh)
    # then: promtool tsdb create-blocks-from openmetrics run.om data/
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from exporter import metrics as m
from exporter import rank_metrics as rm
from trainer.config import TrainConfig
from trainer.gpu import gpu_index, gpu_state, gpu_uuid, node_of
from trainer.record import StepRecord, activation_norms
from trainer.run import Trainer, compute_seconds

# 2026-01-01T00:00:00Z: a fixed start keeps offline files reproducible byte for byte.
DEFAULT_START = 1767225600.0


@dataclass(frozen=True)
class OfflineRun:
    cfg: TrainConfig
    records: list[StepRecord]
    start: float = DEFAULT_START
    # Stamps this many milliseconds before the lab clock says, exactly: the backtest moves its
    # runs against Prometheus's whole-second grid (runwatch.backtest.GRID_PHASE_MS).
    shift_ms: int = 0

    @property
    def labels(self) -> str:
        return f'job="trainer",instance="offline/{self.cfg.label}",run_id="{self.cfg.label}"'

    def step_time(self, i: int) -> float:
        """Unix time at which step i ends on the lab clock (its sample's stamp, unless shifted)."""
        return self.start + self.records[i].lab_time

    def stamps(self) -> list[str]:
        """Each step's sample timestamp as written: seconds with millisecond precision."""
        stamps = [f"{self.step_time(i):.3f}" for i in range(len(self.records))]
        if self.shift_ms:
            ms = [int(s.replace(".", "")) - self.shift_ms for s in stamps]  # exact, in integers
            stamps = [f"{t // 1000}.{t % 1000:03d}" for t in ms]
        return stamps


def simulate(cfg: TrainConfig, start: float = DEFAULT_START) -> OfflineRun:
    """Train every step of cfg unpaced and keep the records."""
    return OfflineRun(cfg, Trainer(cfg).run(), start)


def cumulative(values: list[float]) -> list[float]:
    """A counter's values: the running sum, added in turn as a live counter adds them."""
    return [float(v) for v in itertools.accumulate(values)]


def _families(run: OfflineRun) -> dict[str, tuple[str, list[tuple[str, Callable[[], list[float]]]]]]:
    """name -> (type, [(labels, a function giving one value per step), ...]) for one run: one
    series of each family, and one per rank of the rank families. The values are computed only
    for the families written (the backtest writes few)."""
    recs, cfg = run.records, run.cfg
    norms = functools.cache(lambda: activation_norms([r.logits for r in recs]))  # the whole run in one pass
    n = len(recs)
    fam = {
        m.STEP: ("gauge", run.labels, lambda: [float(r.step) for r in recs]),
        m.LOSS: ("gauge", run.labels, lambda: [r.loss for r in recs]),
        m.HELDOUT_LOSS: ("gauge", run.labels, lambda: [r.heldout_loss for r in recs]),
        m.GRADIENT_NORM: ("gauge", run.labels, lambda: [r.gradient_norm for r in recs]),
        m.TOKENS_PER_SECOND: ("gauge", run.labels, lambda: [r.tokens_per_second for r in recs]),
        m.TOKENS: ("counter", run.labels, lambda: cumulative([r.tokens for r in recs])),
        "up": ("gauge", f'job="trainer",instance="offline/{cfg.label}"', lambda: [1.0] * n),
    }
    info_incident = m.HIDDEN if cfg.drill else cfg.incident
    fam[m.RUN_INFO] = ("gauge", f'{run.labels},seed="{cfg.seed}",incident="{info_incident}"', lambda: [1.0] * n)
    fam[m.RUN_START] = ("gauge", run.labels, lambda: [run.start] * n)
    # the live exporter says when a run ended once it has: here, at its last step only
    fam[m.RUN_END] = ("gauge", run.labels, lambda: [math.nan] * (n - 1) + [run.step_time(n - 1)])
    fam[m.LOGIT_NORM_MEAN] = ("gauge", run.labels, lambda: norms()[0])
    fam[m.LOGIT_NORM_MAX] = ("gauge", run.labels, lambda: norms()[1])
    fam[m.WEIGHT_NORM] = ("gauge", run.labels, lambda: [r.weight_norm for r in recs])
    fam[m.EXPECTED_LOSS] = ("gauge", run.labels, lambda: [r.expected_loss for r in recs])
    if cfg.precision == "fp16":
        fam[m.LOSS_SCALE] = ("gauge", run.labels, lambda: [r.loss_scale for r in recs])
        fam[m.SKIPPED_STEPS] = ("counter", run.labels, lambda: cumulative([int(r.skipped) for r in recs]))
    if not cfg.drill:
        fam[m.LEARNING_RATE] = ("gauge", run.labels, lambda: [r.lr for r in recs])
        fam[m.INCIDENT_ACTIVE] = ("gauge", run.labels, lambda: [1.0 if r.incident_active else 0.0 for r in recs])
    out = {name: (kind, [(labels, values)]) for name, (kind, labels, values) in fam.items()}
    if cfg.ranks > 1:
        for name, (kind, series) in _rank_families(run).items():
            out.setdefault(name, (kind, []))[1].extend(series)
    return out


def _rank_families(run: OfflineRun) -> dict[str, tuple[str, list[tuple[str, Callable[[], list[float]]]]]]:
    """What each rank's exporter serves (exporter.rank_metrics), on the lab clock: each rank
    computes for its own device time; the exchange starts when the slowest arrives and takes
    collective_seconds, so a rank waits the step's duration less its own compute."""
    cfg, recs = run.cfg, run.records
    compute = functools.cache(lambda: compute_seconds(cfg)[:, : len(recs)])
    steps = [r.duration_seconds for r in recs]
    fam: dict[str, tuple[str, list[tuple[str, Callable[[], list[float]]]]]] = {}

    def add(name: str, kind: str, labels: str, values: Callable[[], list[float]]) -> None:
        fam.setdefault(name, (kind, []))[1].append((labels, values))

    for rank in range(cfg.ranks):
        target = f'job="ranks",instance="offline/{cfg.label}/rank{rank}"'
        labels = f'{target},run_id="{cfg.label}",rank="{rank}",node="{node_of(cfg, rank)}"'
        gpu = f'{target},gpu="{gpu_index(cfg, rank)}",UUID="{gpu_uuid(cfg, rank)}",Hostname="{node_of(cfg, rank)}"'
        own = functools.cache(lambda rank=rank: compute()[rank].tolist())
        waits = functools.cache(lambda own=own: [d - c for d, c in zip(steps, own(), strict=True)])
        states = functools.cache(lambda rank=rank: [gpu_state(cfg, rank, s) for s in range(len(recs))])
        add("up", "gauge", target, lambda: [1.0] * len(recs))
        add(rm.RANK_STEP, "gauge", labels, lambda: [float(r.step) for r in recs])
        add(rm.RANK_COMPUTE_SECONDS, "gauge", labels, own)
        add(rm.RANK_WAIT_SECONDS, "gauge", labels, waits)
        add(rm.RANK_STEP_SECONDS, "gauge", labels, lambda: list(steps))
        add(rm.RANK_COLLECTIVE_SEQ, "gauge", labels, lambda: [float(r.step + 1) for r in recs])
        add(rm.RANK_COMPUTE_TOTAL, "counter", labels, lambda own=own: cumulative(own()))
        add(rm.RANK_WAIT_TOTAL, "counter", labels, lambda waits=waits: cumulative(waits()))
        for name, field in ((rm.GPU_TEMP, "temp_c"), (rm.GPU_SM_CLOCK, "sm_clock_mhz"), (rm.GPU_POWER, "power_w"),
                            (rm.GPU_FB_USED, "fb_used_mib"), (rm.GPU_XID, "xid")):  # fmt: skip
            add(name, "gauge", gpu, lambda states=states, field=field: [float(getattr(g, field)) for g in states()])
    return fam


FAMILIES = (
    m.STEP, m.LOSS, m.HELDOUT_LOSS, m.GRADIENT_NORM, m.TOKENS_PER_SECOND, m.TOKENS, "up", m.RUN_INFO,
    m.RUN_START, m.RUN_END,
    m.LOGIT_NORM_MEAN, m.LOGIT_NORM_MAX, m.WEIGHT_NORM, m.EXPECTED_LOSS, m.LOSS_SCALE, m.SKIPPED_STEPS,
    m.LEARNING_RATE, m.INCIDENT_ACTIVE,
    rm.RANK_STEP, rm.RANK_COMPUTE_SECONDS, rm.RANK_WAIT_SECONDS, rm.RANK_STEP_SECONDS, rm.RANK_COLLECTIVE_SEQ,
    rm.RANK_COMPUTE_TOTAL, rm.RANK_WAIT_TOTAL, rm.GPU_TEMP, rm.GPU_SM_CLOCK, rm.GPU_POWER, rm.GPU_FB_USED, rm.GPU_XID,
)  # fmt: skip


HELP = {**m.HELP, **rm.HELP, **rm.TOTAL_HELP}


def write_openmetrics(runs: list[OfflineRun], fh: TextIO, families: set[str] | None = None) -> int:
    """Write every run as one OpenMetrics exposition; return the number of samples written.

    `families` limits the file to those metric families (the backtest loads only what its
    rules read). OpenMetrics wants each family's samples together, so families are the outer loop.
    """
    per_run = [_families(r) for r in runs]
    names = [n for n in dict.fromkeys(n for fams in per_run for n in fams) if families is None or n in families]
    stamps = [r.stamps() for r in runs]
    count = 0
    for name in names:
        kind = next(fams[name][0] for fams in per_run if name in fams)
        help_text = HELP.get(name, "1 if the target was scraped successfully.")
        fh.write(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        sample = f"{name}_total" if kind == "counter" else name
        for fams, stamp in zip(per_run, stamps, strict=True):
            for labels, values in fams[name][1] if name in fams else ():
                head = f"{sample}{{{labels}}} "
                # NaN marks "no value yet" (the expected loss before its fit): a scrape would not have it
                lines = [f"{head}{float(v)!r} {t}\n" for v, t in zip(values(), stamp, strict=True) if v == v]
                fh.writelines(lines)
                count += len(lines)
    fh.write("# EOF\n")
    return count

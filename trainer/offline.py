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
from trainer.config import TrainConfig
from trainer.record import StepRecord, activation_norms
from trainer.run import Trainer

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


def _families(run: OfflineRun) -> dict[str, tuple[str, str, Callable[[], list[float]]]]:
    """name -> (type, labels, a function giving one value per step) for one run. The values are
    computed only for the families written (the backtest writes few)."""
    recs, cfg = run.records, run.cfg

    def cumulative(values: list[float]) -> list[float]:
        return [float(v) for v in itertools.accumulate(values)]

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
    return fam


FAMILIES = (
    m.STEP, m.LOSS, m.HELDOUT_LOSS, m.GRADIENT_NORM, m.TOKENS_PER_SECOND, m.TOKENS, "up", m.RUN_INFO,
    m.RUN_START, m.RUN_END,
    m.LOGIT_NORM_MEAN, m.LOGIT_NORM_MAX, m.WEIGHT_NORM, m.EXPECTED_LOSS, m.LOSS_SCALE, m.SKIPPED_STEPS,
    m.LEARNING_RATE, m.INCIDENT_ACTIVE,
)  # fmt: skip


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
        help_text = m.HELP.get(name, "1 if the target was scraped successfully.")
        fh.write(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        sample = f"{name}_total" if kind == "counter" else name
        for fams, stamp in zip(per_run, stamps, strict=True):
            if name not in fams:
                continue
            _, labels, values = fams[name]
            head = f"{sample}{{{labels}}} "
            # NaN marks "no value yet" (the expected loss before its fit): a scrape would not have it
            lines = [f"{head}{float(v)!r} {t}\n" for v, t in zip(values(), stamp, strict=True) if v == v]
            fh.writelines(lines)
            count += len(lines)
    fh.write("# EOF\n")
    return count

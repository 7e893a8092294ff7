"""Whole runs at full speed, written as timestamped OpenMetrics text for promtool to backfill.

The file holds what a 1 s scrape of the live exporter would have stored: the same metric
names and `run_id` label, plus the target labels `job="trainer"` and one `instance` per run,
and `up` = 1. Step s is stamped at the end of step s on the lab clock (start + the simulated
device time of steps 0..s), so slow-node steps are 1/0.7 s apart. The step-duration histogram
is left out; tokens per second carries the same information. A run over several ranks adds
each rank's series, its GPU's and the launcher's; a cluster fault (trainer.faults) adds a
sample a second while the job stalls, and `up` = 0 while it is down, until its restart.

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
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

from runwatch.exporter import metrics as m
from runwatch.exporter import rank_metrics as rm
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.faults import Fault, Sample, attempts, fault_of, lost_steps, schedule
from runwatch.trainer.gpu import gpu_index, gpu_state, gpu_uuid, node_of
from runwatch.trainer.record import Columns, StepRecord
from runwatch.trainer.run import Trainer, compute_seconds

# 2026-01-01T00:00:00Z: a fixed start keeps offline files reproducible byte for byte.
DEFAULT_START = 1767225600.0


@dataclass(frozen=True)
class OfflineRun:
    cfg: TrainConfig
    records: list[StepRecord] | Columns  # as the trainer made them, or field by field (trainer.batch)
    start: float = DEFAULT_START
    # Stamps this many milliseconds before the lab clock says, exactly: the backtest moves its
    # runs against Prometheus's whole-second grid (runwatch.backtest.GRID_PHASE_MS).
    shift_ms: int = 0

    @property
    def labels(self) -> str:
        return f'job="trainer",instance="offline/{self.cfg.label}",run_id="{self.cfg.label}"'

    @functools.cached_property
    def columns(self) -> Columns:
        """The run's records, field by field: what the writers read."""
        return self.records if isinstance(self.records, Columns) else Columns.of(self.records)

    def step_time(self, i: int) -> float:
        """Unix time at which step i ends on the lab clock, if no fault stopped the job before it."""
        return self.start + self.columns.lab_time[i]

    @functools.cached_property
    def samples(self) -> list[Sample] | None:
        """A run with a fault (trainer.faults): every scrape, through its stall, teardown and
        restart. None for any other run: one sample as each step ends."""
        if fault_of(self.cfg) is None:
            return None
        return schedule(self.cfg, self.columns.lab_time, compute_seconds(self.cfg))

    def end_time(self) -> float:
        """Unix time of the run's last sample (its last step's end, on the lab clock)."""
        return self.start + (self.columns.lab_time[-1] if self.samples is None else self.samples[-1].t)

    def fault_time(self) -> float | None:
        """Unix time, as stamped, at which the run's fault struck: the end of the last step before
        a hang or crash, the end of the step whose GPU reported an ECC error. None: no fault."""
        fault = fault_of(self.cfg)
        if fault is None:
            return None
        step = fault.step if fault.kind == "ecc" else fault.step - 1
        return self.step_time(step) - self.shift_ms / 1000

    def stamps_ms(self) -> list[int]:
        """Each sample's timestamp in Unix milliseconds: the lab clock rounded to the millisecond,
        then shifted, exactly, in integers."""
        if self.samples is None:
            stamps = [f"{self.start + t:.3f}" for t in self.columns.lab_time]
        else:
            stamps = [f"{self.start + s.t:.3f}" for s in self.samples]
        return [int(s.replace(".", "")) - self.shift_ms for s in stamps]

    def stamps(self) -> list[str]:
        """Each sample's timestamp as written: seconds with millisecond precision."""
        return [f"{t // 1000}.{t % 1000:03d}" for t in self.stamps_ms()]


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
    col, cfg = run.columns, run.cfg  # the lists a value function returns are never written to
    n = len(col)
    fam = {
        m.STEP: ("gauge", run.labels, lambda: [float(s) for s in col.step]),
        m.LOSS: ("gauge", run.labels, lambda: col.loss),
        m.HELDOUT_LOSS: ("gauge", run.labels, lambda: col.heldout_loss),
        m.GRADIENT_NORM: ("gauge", run.labels, lambda: col.gradient_norm),
        m.TOKENS_PER_SECOND: ("gauge", run.labels, lambda: col.tokens_per_second),
        m.TOKENS: ("counter", run.labels, lambda: cumulative(col.tokens)),
        "up": ("gauge", f'job="trainer",instance="offline/{cfg.label}"', lambda: [1.0] * n),
    }
    info_incident = m.HIDDEN if cfg.drill else cfg.incident
    info_seed = m.HIDDEN if cfg.drill else cfg.seed
    fam[m.RUN_INFO] = ("gauge", f'{run.labels},seed="{info_seed}",incident="{info_incident}"', lambda: [1.0] * n)
    fam[m.RUN_START] = ("gauge", run.labels, lambda: [run.start] * n)
    # the live exporter says when a run ended once it has: here, at its last step only
    fam[m.RUN_END] = ("gauge", run.labels, lambda: [math.nan] * (n - 1) + [run.end_time()])
    fam[m.LOGIT_NORM_MEAN] = ("gauge", run.labels, lambda: col.logit_norms[0])  # the whole run in one pass
    fam[m.LOGIT_NORM_MAX] = ("gauge", run.labels, lambda: col.logit_norms[1])
    fam[m.WEIGHT_NORM] = ("gauge", run.labels, lambda: col.weight_norm)
    fam[m.EXPECTED_LOSS] = ("gauge", run.labels, lambda: col.expected_loss)
    if cfg.precision == "fp16":
        fam[m.LOSS_SCALE] = ("gauge", run.labels, lambda: col.loss_scale)
        fam[m.SKIPPED_STEPS] = ("counter", run.labels, lambda: cumulative([int(s) for s in col.skipped]))
    if not cfg.drill:
        fam[m.LEARNING_RATE] = ("gauge", run.labels, lambda: col.lr)
        fam[m.INCIDENT_ACTIVE] = ("gauge", run.labels, lambda: [1.0 if a else 0.0 for a in col.incident_active])
    if run.samples is not None:  # rank 0 serves these: not while the job is down
        fam = {name: (kind, labels, _scraped(run, values)) for name, (kind, labels, values) in fam.items()}
        fam["up"] = ("gauge", fam["up"][1], lambda: [0.0 if s.state == "down" else 1.0 for s in run.samples])
    out = {name: (kind, [(labels, values)]) for name, (kind, labels, values) in fam.items()}
    if cfg.ranks > 1:
        for name, (kind, series) in _rank_families(run).items():
            out.setdefault(name, (kind, []))[1].extend(series)
    return out


def _scraped(run: OfflineRun, values: Callable[[], list[float]]) -> Callable[[], list[float]]:
    """A series of one value per step, as the scrapes of a run with a fault saw it: the step's
    value as it ends, the last one while the job stalls, none (NaN) while it is down."""

    def seen() -> list[float]:
        per_step = values()
        return [math.nan if s.state == "down" else per_step[s.step] for s in run.samples or ()]

    return values if run.samples is None else seen


def _rank_families(run: OfflineRun) -> dict[str, tuple[str, list[tuple[str, Callable[[], list[float]]]]]]:
    """What each rank's exporter serves (exporter.rank_metrics), and the launcher's, on the lab
    clock: each rank computes for its own device time; the exchange starts when the slowest
    arrives and takes collective_seconds, so a rank waits the step's duration less its own
    compute. A fault's stall, teardown and restart are as trainer.faults schedules them."""
    cfg, col, samples = run.cfg, run.columns, run.samples
    compute = functools.cache(lambda: compute_seconds(cfg)[:, : len(col)])
    steps = col.duration_seconds
    fault = fault_of(cfg)
    # (state, step, attempt) of every sample: a run without a fault has one per step
    seen = samples or [Sample(t, i, 0, "step") for i, t in enumerate(col.lab_time)]
    stamps = functools.cache(lambda: [float(t) for t in run.stamps()])
    fam: dict[str, tuple[str, list[tuple[str, Callable[[], list[float]]]]]] = {}

    def add(name: str, kind: str, labels: str, values: Callable[[], list[float]], scraped: bool = True) -> None:
        fam.setdefault(name, (kind, []))[1].append((labels, _scraped(run, values) if scraped else values))

    def finished() -> list[float]:  # when the step each sample shows finished: the last step sample's stamp
        out, last = [], math.nan
        for s, t in zip(seen, stamps(), strict=True):
            last = t if s.state == "step" else last
            out.append(math.nan if s.state == "down" else last)
        return out

    for rank in range(cfg.ranks):
        target = f'job="ranks",instance="offline/{cfg.label}/rank{rank}"'
        labels = f'{target},run_id="{cfg.label}",rank="{rank}",node="{node_of(cfg, rank)}"'
        gpu = f'{target},gpu="{gpu_index(cfg, rank)}",UUID="{gpu_uuid(cfg, rank)}",Hostname="{node_of(cfg, rank)}"'
        own = functools.cache(lambda rank=rank: compute()[rank].tolist())
        waits = functools.cache(lambda own=own: [d - c for d, c in zip(steps, own(), strict=True)])
        states = functools.cache(lambda rank=rank: [gpu_state(cfg, rank, s) for s in range(len(col))])
        # as the lab labels its rank targets (runwatch.lab): so that an alert on `up` names the rank
        add("up", "gauge", labels, lambda: [0.0 if s.state == "down" else 1.0 for s in seen], scraped=False)
        add(rm.RANK_STEP, "gauge", labels, lambda: [float(s) for s in col.step])
        add(rm.RANK_COMPUTE_SECONDS, "gauge", labels, own)
        add(rm.RANK_WAIT_SECONDS, "gauge", labels, waits)
        add(rm.RANK_STEP_SECONDS, "gauge", labels, lambda: list(steps))
        add(rm.RANK_LAST_STEP_TIME, "gauge", labels, finished, scraped=False)
        add(rm.RANK_COLLECTIVE_SEQ, "gauge", labels, lambda rank=rank: _entered(seen, fault, rank), scraped=False)
        add(rm.RANK_COMPUTE_TOTAL, "counter", labels, lambda own=own: cumulative(own()))
        add(rm.RANK_WAIT_TOTAL, "counter", labels, lambda waits=waits: cumulative(waits()))
        for name, field in ((rm.GPU_TEMP, "temp_c"), (rm.GPU_SM_CLOCK, "sm_clock_mhz"), (rm.GPU_POWER, "power_w"),
                            (rm.GPU_FB_USED, "fb_used_mib")):  # fmt: skip
            add(name, "gauge", gpu, lambda states=states, field=field: [float(getattr(g, field)) for g in states()])
        add(rm.GPU_XID, "gauge", gpu, lambda rank=rank: _xids(seen, fault, rank), scraped=False)
    launcher = f'job="launcher",instance="offline/{cfg.label}/launcher",run_id="{cfg.label}"'
    job = functools.cache(lambda: _launcher(run, seen))
    for i, name in enumerate((rm.JOB_RESTARTS, rm.JOB_LOST_STEPS, rm.JOB_ETTR)):
        add(name, "gauge" if name == rm.JOB_ETTR else "counter", launcher, lambda i=i: job()[i], scraped=False)
    return fam


def _entered(seen: list[Sample], fault: Fault | None, rank: int) -> list[float]:
    """The rank's collective sequence number: step s enters collective s+1. While a hang or a
    crash stalls the job, the others have entered the next collective and the struck rank has not."""
    out = []
    for s in seen:
        ahead = s.state == "stall" and rank != fault.rank
        out.append(math.nan if s.state == "down" else float(s.step + 1 + ahead))
    return out


def _xids(seen: list[Sample], fault: Fault | None, rank: int) -> list[float]:
    """The last XID of the rank's GPU: a crash's from its strike until the process exits, an ECC
    error's from its step until the drain. The restarted job runs on a healthy spare."""
    out = []
    for s in seen:
        struck = fault is not None and rank == fault.rank and s.attempt == 0
        if fault is not None and fault.kind == "rank_crash":
            struck = struck and s.state == "stall"
        elif fault is not None:
            struck = struck and s.step >= fault.step
        out.append(math.nan if s.state == "down" else float(fault.xid if struck else 0))
    return out


def _launcher(run: OfflineRun, seen: list[Sample]) -> tuple[list[float], list[float], list[float]]:
    """The launcher's restarts, lost steps and ETTR at each sample. A restart counts from the
    teardown; ETTR is the lab time of the steps the run keeps over the lab time so far."""
    lab_time = run.columns.lab_time
    runs = attempts(run.cfg, lab_time, compute_seconds(run.cfg)) if run.samples else []
    restarts, lost, ettr = [], [], []
    for s in seen:
        done = s.attempt + (s.state == "down")  # attempts torn down by now
        restarts.append(float(done))
        lost.append(float(lost_steps(runs[: done + 1])))
        if s.state == "down":  # the steps since the checkpoint are lost
            first = runs[s.attempt + 1].first
            kept = lab_time[first - 1] if first else 0.0
        else:
            kept = lab_time[s.step]
        ettr.append(kept / s.t)
    return restarts, lost, ettr


FAMILIES = (
    m.STEP, m.LOSS, m.HELDOUT_LOSS, m.GRADIENT_NORM, m.TOKENS_PER_SECOND, m.TOKENS, "up", m.RUN_INFO,
    m.RUN_START, m.RUN_END,
    m.LOGIT_NORM_MEAN, m.LOGIT_NORM_MAX, m.WEIGHT_NORM, m.EXPECTED_LOSS, m.LOSS_SCALE, m.SKIPPED_STEPS,
    m.LEARNING_RATE, m.INCIDENT_ACTIVE,
    rm.RANK_STEP, rm.RANK_COMPUTE_SECONDS, rm.RANK_WAIT_SECONDS, rm.RANK_STEP_SECONDS, rm.RANK_COLLECTIVE_SEQ,
    rm.RANK_COMPUTE_TOTAL, rm.RANK_WAIT_TOTAL, rm.RANK_LAST_STEP_TIME, rm.GPU_TEMP, rm.GPU_SM_CLOCK, rm.GPU_POWER,
    rm.GPU_FB_USED, rm.GPU_XID, rm.JOB_RESTARTS, rm.JOB_LOST_STEPS, rm.JOB_ETTR,
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


# a label as _families writes it: its values are names and numbers, never quoted or escaped
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')


def series(
    run: OfflineRun, families: set[str] | None = None
) -> Iterator[tuple[str, list[tuple[str, str]], list[float], list[int]]]:
    """Every series of one run, as write_openmetrics writes it: (sample name, its labels as
    (name, value) pairs, one value per timestamp, the timestamps in Unix ms). A NaN value is no
    sample. For a writer other than OpenMetrics text (runwatch.backtest.remote_write)."""
    stamps = run.stamps_ms()
    for name, (kind, entries) in _families(run).items():
        if families is not None and name not in families:
            continue
        sample = f"{name}_total" if kind == "counter" else name
        for labels, values in entries:
            pairs = _LABEL.findall(labels)
            if ",".join(f'{k}="{v}"' for k, v in pairs) != labels:  # a value this parse would misread
                raise ValueError(f"series: cannot split the labels of {sample}: {labels}")
            yield sample, pairs, values(), stamps

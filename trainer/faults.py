"""Faults that stop a cluster job, and the job's restart: issue 15's hang, crash and ECC error,
each on one rank chosen by the seed, at a step drawn from it (trainer.run.fault_step).

- hang: the rank stops before its gradient exchange. The others enter the exchange and wait;
  no step finishes. Each rank's watchdog aborts after `watchdog_seconds` in one exchange (as
  NCCL's does), and mpiexec tears the job down.
- rank_crash: the rank's GPU falls off the bus (XID 79). The rank's process exits
  XID_EXIT_SECONDS later, and mpiexec tears the job down.
- ecc: the GPU reports XID 48 (a double-bit ECC error) or 63 (a row remap pending). Training
  goes on to the next checkpoint; there the job stops, so that the node can be drained.

After a teardown the launcher waits `restart_seconds` (a spare node, the job's start-up) and
restarts every rank from the last checkpoint, as torchrun's elastic agent does: the steps since
the checkpoint are trained again and counted as lost. A fault strikes once; the restarted job
runs on the spare.

Live, trainer.rank and runwatch.cluster.launcher act this out; offline, `attempts` and `schedule` say
when each step ended and what a 1 s scrape saw in between (trainer.offline writes it).

    >>> fault_of(TrainConfig(ranks=4, incident="rank_crash", seed=3)).xid
    79
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import _CLUSTER, _rng, fault_step, struck_rank

XID_FELL_OFF_BUS, XID_DOUBLE_BIT_ECC, XID_ROW_REMAP = 79, 48, 63
# A GPU that fell off the bus: the driver logs XID 79, the rank's next CUDA call fails, and its
# process exits this long after. Its exporter serves the XID meanwhile (two 1 s scrapes).
XID_EXIT_SECONDS = 3.0
SCRAPE_SECONDS = 1.0  # prometheus/prometheus.yml's scrape_interval


@dataclass(frozen=True)
class Fault:
    kind: str  # hang, rank_crash or ecc
    rank: int  # the rank it strikes
    step: int  # the step it strikes: the rank never enters (hang, crash) or finishes it with an XID (ecc)
    xid: int  # what the rank's GPU reports from then on; 0 for a hang


def fault_of(cfg: TrainConfig) -> Fault | None:
    """The run's fault, or None for a run without one."""
    if cfg.incident == "hang":
        xid = 0
    elif cfg.incident == "rank_crash":
        xid = XID_FELL_OFF_BUS
    elif cfg.incident == "ecc":
        xid = (XID_DOUBLE_BIT_ECC, XID_ROW_REMAP)[int(_rng(cfg, _CLUSTER, 2).integers(2))]
    else:
        return None
    return Fault(cfg.incident, struck_rank(cfg), fault_step(cfg), xid)


def checkpoint_before(cfg: TrainConfig, step: int) -> int:
    """The last step at or before `step` after which a checkpoint is saved; -1 for none."""
    return (step + 1) // cfg.checkpoint_every * cfg.checkpoint_every - 1


def drain_step(cfg: TrainConfig, fault: Fault) -> int | None:
    """An ECC fault's drain: the step whose checkpoint the job stops at, or None when the run
    ends first."""
    step = checkpoint_before(cfg, fault.step) + cfg.checkpoint_every
    return step if step < cfg.steps - 1 else None


@dataclass(frozen=True)
class Attempt:
    """One start of the job: it trains steps [first, end) and is torn down at `stopped` (lab
    seconds from the run's start), or completes the run (stopped None)."""

    first: int
    end: int
    began: float
    stopped: float | None


def attempts(cfg: TrainConfig, lab_times: list[float], compute: np.ndarray) -> list[Attempt]:
    """The job's attempts, on the lab clock. lab_times[s] is the trainer's lab time after step s
    (its device time so far), compute[r, s] rank r's compute time in step s."""
    fault = fault_of(cfg)
    whole = [Attempt(0, cfg.steps, 0.0, None)]
    if fault is None:
        return whole
    if fault.kind == "ecc":
        drain = drain_step(cfg, fault)
        if drain is None:
            return whole
        end, stopped = drain + 1, lab_times[drain]
    else:
        end = fault.step
        last = lab_times[end - 1] if end else 0.0
        if fault.kind == "hang":  # the first rank to enter the exchange is the first to give up
            entered = min(float(compute[r, end]) for r in range(cfg.ranks) if r != fault.rank)
            stopped = last + entered + cfg.watchdog_seconds
        else:
            stopped = last + XID_EXIT_SECONDS
    resume = checkpoint_before(cfg, end - 1) + 1
    return [Attempt(0, end, 0.0, stopped), Attempt(resume, cfg.steps, stopped + cfg.restart_seconds, None)]


@dataclass(frozen=True)
class Sample:
    """What one scrape saw: at lab time `t`, the state after step `step` of attempt `attempt`.
    `state` is "step" (the scrape right as that step ended), "stall" (the job is up, no step
    ends: the ranks wait) or "down" (torn down: only the launcher answers)."""

    t: float
    step: int
    attempt: int
    state: str


def schedule(cfg: TrainConfig, lab_times: list[float], compute: np.ndarray) -> list[Sample]:
    """Every sample of a run: one as each step ends, and between attempts one a second, while
    the job stalls and while it is down. Without a fault: one per step, at lab_times."""
    runs = attempts(cfg, lab_times, compute)
    out: list[Sample] = []
    for i, a in enumerate(runs):
        base = lab_times[a.first - 1] if a.first else 0.0
        for s in range(a.first, a.end):
            out.append(Sample(lab_times[s] if i == 0 else a.began + (lab_times[s] - base), s, i, "step"))
        if a.stopped is None:
            continue
        last = out[-1]
        out += [Sample(t, last.step, i, "stall") for t in _ticks(last.t, a.stopped)]
        out += [Sample(t, last.step, i, "down") for t in _ticks(a.stopped - SCRAPE_SECONDS, runs[i + 1].began)]
    return out


def _ticks(after: float, before: float) -> list[float]:
    """Scrape times a second apart, after `after` and before `before`."""
    n = math.ceil((before - after) / SCRAPE_SECONDS) - 1
    return [after + SCRAPE_SECONDS * k for k in range(1, max(n, 0) + 1)]


def lost_steps(runs: list[Attempt]) -> int:
    """Steps trained twice: finished by a torn-down attempt, then again by the next."""
    return sum(a.end - b.first for a, b in zip(runs, runs[1:], strict=False))

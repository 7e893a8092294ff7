"""One rank's metrics, on its own port: its step, compute and collective-wait times, the flight
recorder's sequence number, and its GPU under DCGM exporter's names.

Each rank of a cluster run (trainer.rank) serves one of these registries; Prometheus scrapes each
rank as its own target. Rank series carry `run_id`, `rank` and `node`; the GPU's carry what DCGM
exporter puts on them: `gpu` (the index on its host), `UUID` and `Hostname`.

Not the job's training metrics (loss, gradient norm, tokens/s): rank 0 serves those, as
`exporter.metrics.TrainerMetrics`, where a one-process run serves them. Like it, this takes
plain values: the rank computes them (trainer.rank, trainer.gpu).

    >>> m = RankMetrics(run_id="none-0", rank=1, node="node0", gpu="1", uuid="GPU-...")
    >>> m.entered(seq=8)
    >>> m.observe(step=7, compute=1.01, wait=0.02, step_seconds=1.04)
    >>> m.observe_gpu(temp_c=62.3, sm_clock_mhz=1980.0, power_w=561.2, fb_used_mib=61440.0, xid=0)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

RANK_STEP = "runwatch_rank_step"
RANK_STEP_SECONDS = "runwatch_rank_last_step_seconds"
RANK_COMPUTE_SECONDS = "runwatch_rank_last_compute_seconds"
RANK_WAIT_SECONDS = "runwatch_rank_last_collective_wait_seconds"
RANK_LAST_STEP_TIME = "runwatch_rank_last_step_timestamp_seconds"
RANK_COLLECTIVE_SEQ = "runwatch_rank_collective_seq"
# cumulative, for rate(): the share of a rank's time spent computing and waiting
RANK_COMPUTE_TOTAL = "runwatch_rank_compute_seconds"  # a counter: exposed as ..._total
RANK_WAIT_TOTAL = "runwatch_rank_collective_wait_seconds"  # a counter: exposed as ..._total
# NVIDIA dcgm-exporter's names (etc/default-counters.csv), all gauges
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
GPU_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
GPU_POWER = "DCGM_FI_DEV_POWER_USAGE"
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"
GPU_XID = "DCGM_FI_DEV_XID_ERRORS"
# The launcher's, for the whole job (runwatch.cluster.launcher): it restarts the ranks after a fault
JOB_RESTARTS = "runwatch_job_restarts"  # a counter: exposed as ..._total
JOB_LOST_STEPS = "runwatch_job_lost_steps"  # a counter: exposed as ..._total
JOB_ETTR = "runwatch_job_ettr"

HELP = {
    RANK_STEP: "The last training step this rank finished.",
    RANK_STEP_SECONDS: "Wall-clock seconds of this rank's last step, to the end of its gradient exchange.",
    RANK_COMPUTE_SECONDS: "Seconds this rank computed in its last step before it reached the gradient exchange.",
    RANK_WAIT_SECONDS: "Seconds this rank spent in its last gradient exchange, waiting for the slowest rank.",
    RANK_LAST_STEP_TIME: "Unix time at which this rank finished its last step.",
    RANK_COLLECTIVE_SEQ: "Sequence number of the last collective this rank entered, one per step of the run "
    "(the NCCL flight recorder's collective_seq_id).",
    GPU_TEMP: "GPU temperature (in C).",
    GPU_SM_CLOCK: "SM clock frequency (in MHz).",
    GPU_POWER: "Power draw (in W).",
    GPU_FB_USED: "Framebuffer memory used (in MiB).",
    GPU_XID: "Value of the last XID error encountered.",
}


TOTAL_HELP = {
    RANK_COMPUTE_TOTAL: "Seconds this rank has computed, over every step, before reaching the gradient exchange.",
    RANK_WAIT_TOTAL: "Seconds this rank has spent in gradient exchanges, over every step.",
    JOB_RESTARTS: "Times the launcher has torn the job down to restart it from its last checkpoint.",
    JOB_LOST_STEPS: "Steps trained again after restarts: finished after the checkpoint a restart went back to.",
}
HELP[JOB_ETTR] = (
    "Effective training time ratio: lab seconds of the steps the run keeps over the seconds since its first live step."
)


class RankMetrics:
    """A rank's registry; `observe` and `observe_gpu` after each step."""

    def __init__(self, run_id: str, rank: int, node: str, gpu: str, uuid: str,
                 registry: CollectorRegistry | None = None):  # fmt: skip
        self.registry = registry or CollectorRegistry()
        labels = {"run_id": run_id, "rank": str(rank), "node": node}
        device = {"gpu": gpu, "UUID": uuid, "Hostname": node}

        def gauge(name: str, values: dict[str, str]) -> Gauge:
            return Gauge(name, HELP[name], list(values), registry=self.registry).labels(**values)

        names = (RANK_STEP, RANK_STEP_SECONDS, RANK_COMPUTE_SECONDS, RANK_WAIT_SECONDS, RANK_COLLECTIVE_SEQ)
        self.rank_gauges = {n: gauge(n, labels) for n in names}
        self._labels = labels
        self._last_step_time = Gauge(
            RANK_LAST_STEP_TIME, HELP[RANK_LAST_STEP_TIME], list(labels), registry=self.registry
        )
        self.gpu_gauges = {n: gauge(n, device) for n in (GPU_TEMP, GPU_SM_CLOCK, GPU_POWER, GPU_FB_USED, GPU_XID)}
        self.totals = {
            n: Counter(n, TOTAL_HELP[n], list(labels), registry=self.registry).labels(**labels)
            for n in (RANK_COMPUTE_TOTAL, RANK_WAIT_TOTAL)
        }

    def entered(self, seq: int) -> None:
        """The rank entered the collective `seq` (and may now wait in it)."""
        self.rank_gauges[RANK_COLLECTIVE_SEQ].set(seq)

    def observe(self, step: int, compute: float, wait: float, step_seconds: float) -> None:
        """A step finished: its exchange completed."""
        g = self.rank_gauges
        g[RANK_COMPUTE_SECONDS].set(compute)
        g[RANK_WAIT_SECONDS].set(wait)
        self.totals[RANK_COMPUTE_TOTAL].inc(compute)
        self.totals[RANK_WAIT_TOTAL].inc(wait)
        g[RANK_STEP_SECONDS].set(step_seconds)
        g[RANK_STEP].set(step)
        if RANK_LAST_STEP_TIME not in g:  # absent until a step has finished: no stall is read into a start
            g[RANK_LAST_STEP_TIME] = self._last_step_time.labels(**self._labels)
        g[RANK_LAST_STEP_TIME].set(time.time())

    def observe_gpu(self, temp_c: float, sm_clock_mhz: float, power_w: float, fb_used_mib: float, xid: int) -> None:
        readings = {GPU_TEMP: temp_c, GPU_SM_CLOCK: sm_clock_mhz, GPU_POWER: power_w, GPU_FB_USED: fb_used_mib,
                    GPU_XID: xid}  # fmt: skip
        for name, value in readings.items():
            self.gpu_gauges[name].set(value)


class LauncherMetrics:
    """The launcher's registry (runwatch.cluster.launcher): restarts, the steps they lost, and ETTR.

    `ettr` is called at each scrape and returns the ratio, or None before the first live step.

    >>> m = LauncherMetrics("none-0", ettr=lambda: 0.97)
    >>> m.restarted(lost_steps=12)
    """

    def __init__(self, run_id: str, ettr: Callable[[], float | None], registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        labels = {"run_id": run_id}
        self.restarts, self.lost = (
            Counter(n, TOTAL_HELP[n], list(labels), registry=self.registry).labels(**labels)
            for n in (JOB_RESTARTS, JOB_LOST_STEPS)
        )
        gauge = Gauge(JOB_ETTR, HELP[JOB_ETTR], list(labels), registry=self.registry).labels(**labels)
        gauge.set_function(lambda: math.nan if (value := ettr()) is None else value)

    def restarted(self, lost_steps: int) -> None:
        self.restarts.inc()
        self.lost.inc(lost_steps)

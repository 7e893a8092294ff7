"""One rank of a live data-parallel run, under MPI. `runwatch train --ranks N` starts N of them
with `mpiexec`; each runs `runwatch train` itself and comes here.

Each rank computes its share of the step's gradient, takes its own device time for it (a
straggler's is 1/0.7 longer), then exchanges its part with the others' in an allgather. The
ranks really wait on each other: one that arrives late holds every other in the exchange. The
exchange is a nonblocking Iallgather polled every 2 ms: MPICH spins inside a blocking
collective, and three spinning ranks would starve the late one of the CPU it needs to arrive.
Every rank then averages the parts in rank order (trainer.parallel) and takes the same step,
so a live run is, bit for bit, the run `Trainer` simulates in one process.

Rank 0 serves the job's training metrics, where a one-process run does; every rank serves its
own (exporter.rank_metrics) on `rank_port_base + rank`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import numpy as np

from exporter.rank_metrics import RankMetrics
from trainer import parallel
from trainer.config import TrainConfig
from trainer.gpu import gpu_index, gpu_state, gpu_uuid, node_of
from trainer.record import StepRecord
from trainer.run import Trainer, compute_seconds

POLL_SECONDS = 0.002


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop while this rank waited in an exchange: the loop ends as on Ctrl-C."""


class RankTrainer(Trainer):
    """The trainer of one rank: `exchange` computes this rank's part and gathers the others'."""

    def __init__(
        self, cfg: TrainConfig, comm, metrics: RankMetrics, stop: threading.Event, paced_from: int = 0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    ):  # fmt: skip
        super().__init__(cfg)
        self.comm, self.rank, self.metrics, self.stop = comm, comm.Get_rank(), metrics, stop
        self.paced_from, self.clock, self.sleep = paced_from, clock, sleep
        self.compute = compute_seconds(cfg)[self.rank]
        self.seq = 0  # collectives completed: the flight recorder's collective_seq_id
        self.started = 0.0

    def step(self) -> StepRecord:
        self.started = self.clock()
        return super().step()

    def exchange(self, x: np.ndarray, y: np.ndarray) -> list[parallel.Part]:
        s, cfg = self.next_step, self.cfg
        own = parallel.pack(parallel.share_gradient(self.w, self.b, x, y, cfg, self.rank))
        paced = s >= self.paced_from
        if paced:  # this rank's device time for its share
            self._sleep_until(self.started + float(self.compute[s]))
        arrived = self.clock()
        gathered = np.empty(cfg.ranks * own.size)
        request = self.comm.Iallgather(own, gathered)
        while not request.Test():
            if self.stop.is_set():
                raise Interrupted()
            self.sleep(POLL_SECONDS)
        if paced:
            self.sleep(cfg.collective_seconds)
        done = self.clock()
        self.seq += 1
        self.metrics.observe(s, arrived - self.started, done - arrived, done - self.started, self.seq)
        self.metrics.observe_gpu(**dataclasses.asdict(gpu_state(cfg, self.rank, s)))
        return [parallel.unpack(part, cfg) for part in gathered.reshape(cfg.ranks, own.size)]

    def _sleep_until(self, deadline: float) -> None:
        remaining = deadline - self.clock()
        if remaining > 0:
            self.sleep(remaining)


def rank_metrics(cfg: TrainConfig, rank: int) -> RankMetrics:
    """The registry of this rank and its GPU, labelled as Prometheus will see them."""
    node = node_of(cfg, rank)
    metrics = RankMetrics(cfg.label, rank, node, str(gpu_index(cfg, rank)), gpu_uuid(cfg, rank))
    metrics.observe_gpu(**dataclasses.asdict(gpu_state(cfg, rank, 0)))
    return metrics

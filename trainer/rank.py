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

Faults (trainer.faults) strike here, in the job's first attempt: the struck rank hangs or loses
its GPU as its step begins; a rank whose exchange outlasts the watchdog raises JobFailedError; an ECC
error halts every rank at the next checkpoint ("drained"). runwatch.cluster.launcher restarts the job.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import numpy as np

from runwatch.exporter.rank_metrics import RankMetrics
from runwatch.trainer import parallel
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.faults import XID_EXIT_SECONDS, drain_step, fault_of
from runwatch.trainer.gpu import gpu_index, gpu_state, gpu_uuid, node_of
from runwatch.trainer.record import StepRecord
from runwatch.trainer.run import Trainer, compute_seconds

POLL_SECONDS = 0.002


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop while this rank waited in an exchange: the loop ends as on Ctrl-C."""


class JobFailedError(Exception):
    """This rank must end the job: its watchdog gave up on an exchange, or its GPU is lost. The
    rank exits with an error, and mpiexec tears every other rank down."""


class RankTrainer(Trainer):
    """The trainer of one rank: `exchange` computes this rank's part and gathers the others'."""

    def __init__(
        self, cfg: TrainConfig, comm, metrics: RankMetrics, stop: threading.Event, paced_from: int = 0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
        attempt: int = 0, log: Callable[[str], None] = lambda _line: None,
    ):  # fmt: skip
        super().__init__(cfg)
        self.comm, self.rank, self.metrics, self.stop = comm, comm.Get_rank(), metrics, stop
        self.paced_from, self.clock, self.sleep, self.log = paced_from, clock, sleep, log
        self.compute = compute_seconds(cfg)[self.rank]
        # A fault strikes the job's first attempt only: a restarted job runs on a healthy spare.
        self.fault = fault_of(cfg) if attempt == 0 else None
        self.drain = drain_step(cfg, self.fault) if self.fault and self.fault.kind == "ecc" else None
        self.started = 0.0

    def move_onset(self, onset: int) -> None:
        super().move_onset(onset)
        self.compute = compute_seconds(self.cfg)[self.rank]
        if self.fault is not None:  # a fault strikes a drawn number of steps after the onset
            self.fault = fault_of(self.cfg)
            self.drain = drain_step(self.cfg, self.fault) if self.fault.kind == "ecc" else None

    def agree(self, flags: tuple[bool, ...]) -> tuple[bool, ...]:
        """Every rank's flags (trainer.live's watch: hold, onset not ready, clock late), each
        true for all if true for any: the ranks hold, set their clocks and move their onset
        together. A nonblocking allreduce, polled, as the exchange is; a stop while it waits
        ends the loop."""
        from mpi4py import MPI  # a rank runs under MPI; the one-process trainer never comes here

        mine = np.array([float(f) for f in flags])
        out = np.empty_like(mine)
        request = self.comm.Iallreduce(mine, out, op=MPI.MAX)
        while not request.Test():
            if self.stop.is_set():
                raise Interrupted()
            self.sleep(POLL_SECONDS)
        return tuple(bool(v) for v in out)

    def restore(self, path) -> None:
        super().restore(path)
        self.metrics.entered(self.next_step)  # the collectives of the steps the checkpoint holds

    def step(self) -> StepRecord:
        self.started = self.clock()
        rec = super().step()
        if self.drain is not None and rec.step == self.drain:
            self.halted = "drained"  # its checkpoint is saved next; the node is taken out there
        return rec

    def exchange(self, x: np.ndarray, y: np.ndarray) -> list[parallel.Part]:
        s, cfg = self.next_step, self.cfg
        own = parallel.pack(parallel.share_gradient(self.w, self.b, x, y, cfg, self.rank))
        if self.fault and self.fault.rank == self.rank and self.fault.step == s:
            self._strike()  # as the step begins, as trainer.faults has it
        paced = s >= self.paced_from
        if paced:  # this rank's device time for its share
            self._sleep_until(self.started + float(self.compute[s]))
        arrived = self.clock()
        gathered = np.empty(cfg.ranks * own.size)
        self.metrics.entered(s + 1)
        request = self.comm.Iallgather(own, gathered)
        while not request.Test():
            if self.stop.is_set():
                raise Interrupted()
            if self.clock() - arrived > cfg.watchdog_seconds:
                raise JobFailedError(f"watchdog: collective {s + 1} did not complete in {cfg.watchdog_seconds:g} s")
            self.sleep(POLL_SECONDS)
        if paced:
            self.sleep(cfg.collective_seconds)
        done = self.clock()
        self.metrics.observe(s, arrived - self.started, done - arrived, done - self.started)
        self.metrics.observe_gpu(**dataclasses.asdict(gpu_state(cfg, self.rank, s, self._xid(s))))
        return [parallel.unpack(part, cfg) for part in gathered.reshape(cfg.ranks, own.size)]

    def _xid(self, step: int) -> int:
        """An ECC error stays on the GPU's XID gauge from its step until the node is drained."""
        f = self.fault
        return f.xid if f and f.kind == "ecc" and f.rank == self.rank and step >= f.step else 0

    def _strike(self) -> None:
        """This rank's fault, as its step begins: it hangs until the job is torn down, its GPU falls
        off the bus and the process ends, or its GPU reports an ECC error and training goes on."""
        f = self.fault
        if f.kind == "ecc":
            meaning = "double-bit ECC error" if f.xid == 48 else "row remap pending"
            self.log(
                f"rank {self.rank}: Xid {f.xid}: {meaning}; the node is drained at the checkpoint of step {self.drain}"
            )
            return
        if f.kind == "hang":  # a hang says nothing, least of all in a drill
            if not self.cfg.drill:
                self.log(f"rank {self.rank}: hung before collective {f.step + 1} (the hang incident)")
            while not self.stop.is_set():
                self.sleep(POLL_SECONDS * 50)
            raise Interrupted()
        if f.kind == "rank_crash":
            self.log(f"rank {self.rank}: Xid {f.xid}: GPU has fallen off the bus")
            self.metrics.observe_gpu(**dataclasses.asdict(gpu_state(self.cfg, self.rank, f.step - 1, f.xid)))
            if self.stop.wait(XID_EXIT_SECONDS):
                raise Interrupted()
            raise JobFailedError(f"GPU lost (Xid {f.xid})")

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

"""`runwatch train --ranks N` live: N rank processes under MPICH's mpiexec, each a `runwatch train`.

The launcher fixes the run's id (one for every rank), starts
`mpiexec -n N python -m runwatch train ... --run-id ID` in a session of its own, forwards Ctrl-C
and SIGTERM to it once, and returns its status. Each rank, seeing MPICH's PMI_RANK, trains as
trainer.rank describes: rank 0 serves the job's training metrics on --port, writes run.json and
saves the checkpoints; every rank serves its own metrics on --rank-port-base + rank and writes
rank-R.json beside run.json.

Not the offline simulation: `runwatch train --offline --ranks N` simulates the N ranks in one
process, with the same numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from exporter.metrics import TrainerMetrics
from exporter.server import MetricsServer
from runwatch.command import UsageError
from runwatch.promserver import port_is_free
from trainer.config import TrainConfig
from trainer.live import RunRecord, run_live
from trainer.rank import POLL_SECONDS, RankTrainer, rank_metrics

RANK_ENV = "PMI_RANK"  # set by MPICH's mpiexec in every rank it starts
# What the launcher hands on to every rank, by attribute; the rest is fixed by the launcher.
PASSED = ("seed", "steps", "onset", "lr", "incident", "port", "host", "fast_forward", "run_dir", "hold",
          "precision", "ranks", "rank_port_base", "step_seconds", "wait_for_prometheus")  # fmt: skip
FAREWELL_S = 5.0
INSTALL_HINT = "pip install mpi4py mpich (runwatch's cluster extra)"


def mpiexec() -> str:
    """MPICH's launcher: the one beside this Python (the mpich wheel's), else the PATH's."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise UsageError(f"--ranks: mpiexec not found: {INSTALL_HINT}")
    return found


def rank_argv(args: argparse.Namespace, cfg: TrainConfig) -> list[str]:
    """The command line of every rank: this one's flags, and the run id fixed here."""
    argv = [mpiexec(), "-n", str(cfg.ranks), sys.executable, "-m", "runwatch", "train", "--run-id", cfg.label]
    for name in PASSED:
        value = getattr(args, name)
        if value is None or value is False:
            continue
        argv += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return argv


def launch(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """Start the ranks and wait for them; 0 when every rank completed. A busy port is refused
    here, in one line: in a rank, its error would come amid mpiexec's report of the others' end."""
    wanted = [("--port", args.port)] if args.port else []
    if args.rank_port_base:
        wanted += [("--rank-port-base", args.rank_port_base + r) for r in range(cfg.ranks)]
    for flag, port in wanted:
        if not port_is_free(port):
            raise UsageError(f"{flag}: port {port} is already in use on this machine")
    proc = subprocess.Popen(rank_argv(args, cfg), start_new_session=True)
    forwarded = threading.Event()

    def forward(sig: int, _frame: object) -> None:
        if not forwarded.is_set():  # once: a second signal makes mpiexec kill its ranks outright
            forwarded.set()
            proc.send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    code = proc.wait()
    return 0 if code == 0 else 130 if forwarded.is_set() else code


def run_rank(
    args: argparse.Namespace, cfg: TrainConfig, public: TrainConfig, run_dir: Path, serve: Callable[..., MetricsServer]
) -> int:
    """One rank's live run (under mpiexec); `serve` starts a /metrics server as `runwatch train` does."""
    from mpi4py import MPI  # only a rank needs MPI loaded

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != cfg.ranks:
        raise UsageError(f"--ranks: {cfg.ranks} asked for, but mpiexec started {comm.Get_size()}")
    # Stopping has its own communicator: a rank may stop with an exchange of the run pending.
    farewell = comm.Dup()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    own = rank_metrics(cfg, rank)
    metrics = TrainerMetrics(cfg.label, cfg.seed, cfg.incident, precision=cfg.precision)
    own_port = 0 if args.rank_port_base == 0 else args.rank_port_base + rank
    servers = [serve(own.registry, own_port, args.host, "--rank-port-base")]
    if rank == 0:  # the job's training metrics, where a one-process run serves them
        servers.append(serve(metrics.registry, args.port, args.host))
    for server in servers:
        host, port = server.server_address[:2]
        say(f"run {cfg.label} rank {rank}: serving http://{host}:{port}/metrics")
    record = RunRecord(run_dir / ("run.json" if rank == 0 else f"rank-{rank}.json"), cfg, public)
    status = run_live(
        cfg, metrics, record, args.fast_forward, stop, log=say if rank == 0 else lambda _line: None,
        trainer=RankTrainer(cfg, comm, own, stop, paced_from=args.fast_forward),
        checkpoints=run_dir / "checkpoints" if rank == 0 else None,
        scraped=servers[-1].scraped if args.wait_for_prometheus else None,
    )  # fmt: skip
    if rank == 0:
        say(f"run {cfg.label}: {status}")
    if status == "completed":
        stop.wait(args.hold)
    for server in servers:
        server.shutdown()
    if status != "completed":
        # mpiexec kills every rank once one exits with an error: wait until all have saved their
        # record (rank 0: run.json), for at most FAREWELL_S in case one cannot answer. Then exit
        # without MPI_Finalize, which would wait for exchanges that stopped ranks never join.
        bye, deadline = farewell.Ibarrier(), time.monotonic() + FAREWELL_S
        while not bye.Test() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        sys.stdout.flush()
        os._exit(130)
    return 0


def say(line: str) -> None:
    """One line in one write: the ranks share a stdout, and under PYTHONUNBUFFERED print() would
    write the text and its newline apart, letting another rank's line in between."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

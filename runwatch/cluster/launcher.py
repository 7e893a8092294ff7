"""`runwatch train --ranks N` live: N rank processes under MPICH's mpiexec, each a `runwatch train`.

The launcher fixes the run's id (one for every rank), starts
`mpiexec -n N python -m runwatch train ... --run-id ID` in a session of its own, forwards Ctrl-C
and SIGTERM to it once, and returns its status. Each rank, seeing MPICH's PMI_RANK, trains as
trainer.rank describes: rank 0 serves the job's training metrics on --port, writes run.json and
saves the checkpoints; every rank serves its own metrics on --rank-port-base + rank and writes
rank-R.json beside run.json.

When the job fails (a rank's watchdog, a lost GPU: mpiexec ends every rank) or is drained, the
launcher restarts it whole from its last checkpoint, as torchrun's elastic agent does, and
serves on --launcher-port what that cost: restarts, steps lost, and ETTR.

Not the offline simulation: `runwatch train --offline --ranks N` simulates the N ranks in one
process, with the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runwatch.cluster.targets import rank_targets
from runwatch.core.command import UsageError
from runwatch.core.files import write_atomic
from runwatch.drill.answer import answer_path, seal_answer
from runwatch.exporter.metrics import TrainerMetrics
from runwatch.exporter.rank_metrics import LauncherMetrics
from runwatch.exporter.server import MetricsServer
from runwatch.prom.server import baselines_ready, port_is_free
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.live import RunRecord, run_live, utc_now, watch_of
from runwatch.trainer.rank import POLL_SECONDS, JobFailedError, RankTrainer, rank_metrics
from runwatch.trainer.run import Trainer

RANK_ENV = "PMI_RANK"  # set by MPICH's mpiexec in every rank it starts
# What the launcher hands on to every rank, by attribute; the rest is fixed by the launcher.
PASSED = ("seed", "steps", "onset", "lr", "incident", "port", "host", "fast_forward", "run_dir", "hold",
          "precision", "ranks", "rank_port_base", "step_seconds", "wait_for_prometheus", "watchdog_seconds",
          "restart_seconds", "sealed_answer", "prometheus")  # fmt: skip
FAREWELL_S = 5.0
# Restarts the launcher makes before it gives up, as torchrun's --max-restarts: a fault strikes
# a run once, so more than one means something else is wrong (a bug that crashes every start).
MAX_RESTARTS = 3
INSTALL_HINT = "pip install mpi4py mpich (runwatch's cluster extra)"


def mpiexec() -> str:
    """MPICH's launcher: the one beside this Python (the mpich wheel's), else the PATH's."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise UsageError(f"--ranks: mpiexec not found: {INSTALL_HINT}")
    return found


def rank_argv(
    args: argparse.Namespace, cfg: TrainConfig, attempt: int = 0, restart_from: Path | None = None
) -> list[str]:
    """The command line of every rank: this one's flags, the run id fixed here, and which start
    of the job this is (a restart goes on from the checkpoint `restart_from`, or from step 0)."""
    argv = [mpiexec(), "-n", str(cfg.ranks), sys.executable, "-m", "runwatch", "train", "--run-id", cfg.label]
    if attempt:
        argv += ["--attempt", str(attempt)] + (["--restart-from", str(restart_from)] if restart_from else [])
    for name in PASSED:
        value = getattr(args, name)
        if value is None or value is False:
            continue
        argv += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return argv


def write_targets(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """Prometheus's targets of this run's ranks and launcher, into --targets-dir (none for a run of
    one process), each file written whole: compose's Prometheus reads them from a shared volume."""
    host, ranks = args.targets_host, cfg.ranks > 1
    if ranks and 0 in (args.rank_port_base, args.launcher_port):
        raise UsageError("--targets-dir: the targets need fixed ports, not 0 (--rank-port-base, --launcher-port)")
    files = {
        "ranks.json": rank_targets(cfg.label, cfg.ranks, args.rank_port_base, host) if ranks else [],
        "launcher.json": [{"targets": [f"{host}:{args.launcher_port}"]}] if ranks else [],
    }
    try:
        args.targets_dir.mkdir(parents=True, exist_ok=True)
        for name, groups in files.items():
            write_atomic(args.targets_dir / name, json.dumps(groups) + "\n")
    except OSError as err:
        raise UsageError(f"--targets-dir: cannot write {args.targets_dir}: {err.strerror}") from None


class JobProgress:
    """How far the run has got, for the launcher's ETTR: rank 0 writes it into run.json."""

    def __init__(self, run_json: Path, clock: Callable[[], float] = time.time):
        self.path, self.clock = run_json, clock
        self.base: tuple[float, float] | None = None  # (Unix time, lab time) at the first live step
        self.rewound: tuple[str, float] | None = None  # (a failed attempt's started_at, its checkpoint's lab time)

    def rewind(self, started_at: str, lab_time: float) -> None:
        """The attempt that started at `started_at` failed: only its checkpoint's lab time counts."""
        self.ettr()  # the first live step's time, if no scrape has read it yet
        self.rewound = (started_at, lab_time)

    def ettr(self) -> float | None:
        """Lab seconds of the steps the run keeps, over wall seconds since its first live step."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if self.base is None:
            if "live_since" not in data:
                return None
            self.base = (float(data["live_since"]), float(data["live_lab_time"]))
        lab = float(data.get("lab_time", 0.0))
        if self.rewound is not None and self.rewound[0] == data.get("started_at"):
            lab = self.rewound[1]
        wall = self.clock() - self.base[0]
        return max(0.0, lab - self.base[1]) / wall if wall > 0 else None


def launch(args: argparse.Namespace, cfg: TrainConfig, run_dir: Path, serve: Callable[..., MetricsServer]) -> int:
    """Start the ranks and wait for them; 0 when every rank completed. As torchrun's elastic
    agent does, a job that fails (or is drained) is restarted whole from its last checkpoint,
    after cfg.restart_seconds. The launcher serves the restarts, the steps they lost and ETTR.

    A busy port is refused here, in one line: in a rank, its error would come amid mpiexec's
    report of the others' end."""
    wanted = [("--port", args.port)] if args.port else []
    if args.rank_port_base:
        wanted += [("--rank-port-base", args.rank_port_base + r) for r in range(cfg.ranks)]
    for flag, port in wanted:
        if not port_is_free(port):
            raise UsageError(f"{flag}: port {port} is already in use on this machine")
    args.run_dir = run_dir  # every attempt's ranks write here
    if cfg.drill and args.sealed_answer is None:  # drawn here once: every rank reads the same answer
        args.sealed_answer = answer_path(run_dir)
        seal_answer(args.sealed_answer, cfg)
    progress = JobProgress(run_dir / "run.json")
    metrics = LauncherMetrics(cfg.label, progress.ettr)
    server = serve(metrics.registry, args.launcher_port, args.host, "--launcher-port")
    host, port = server.server_address[:2]
    say(f"run {cfg.label} launcher: serving http://{host}:{port}/metrics")
    running: list[subprocess.Popen] = []
    forwarded = threading.Event()

    def forward(sig: int, _frame: object) -> None:
        if not forwarded.is_set():  # once: a second signal makes mpiexec kill its ranks outright
            forwarded.set()
            if running:
                running[-1].send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    since, attempt, restart_from = time.time(), 0, None
    try:
        while True:
            running.append(subprocess.Popen(rank_argv(args, cfg, attempt, restart_from), start_new_session=True))
            code = running[-1].wait()
            if forwarded.is_set():
                return 130
            record = _read_record(run_dir / "run.json")
            status = record.get("status")
            if code == 0 and status != "drained":
                return 0
            if attempt == MAX_RESTARTS:
                say(
                    f"run {cfg.label}: the job stopped {attempt + 1} times; giving up (at most {MAX_RESTARTS} restarts)"
                )
                return code or 1
            restart_from = _restart(cfg, run_dir, since, code, record, metrics, progress)
            if forwarded.wait(cfg.restart_seconds):
                return 130
            attempt += 1
    finally:
        server.shutdown()


def _restart(
    cfg: TrainConfig, run_dir: Path, since: float, code: int, record: dict, metrics: LauncherMetrics,
    progress: JobProgress,
) -> Path | None:  # fmt: skip
    """Count a restart and the steps it loses; the checkpoint to go on from (None: step 0)."""
    restart_from = newest_checkpoint(run_dir / "checkpoints", since)
    step, lab_time = Trainer.position(restart_from) if restart_from else (-1, 0.0)
    last = record.get("last_step")
    lost = max(0, last - step) if isinstance(last, int) else 0
    metrics.restarted(lost)
    progress.rewind(str(record.get("started_at")), lab_time)
    why = "its node is drained" if code == 0 else f"a rank failed, exit status {code}"
    where = f"the checkpoint of step {step}" if restart_from else "step 0"
    say(f"run {cfg.label}: the job stopped after step {last} ({why}); restarting from {where} "
        f"in {cfg.restart_seconds:g} s, {lost} steps lost")  # fmt: skip
    return restart_from


def _read_record(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def newest_checkpoint(folder: Path, since: float) -> Path | None:
    """The newest checkpoint this job saved (none from an earlier run in the same folder)."""
    found = [p for p in folder.glob("checkpoint-*.npz") if p.stat().st_mtime >= since]
    return max(found, default=None)


def _stop_on_signals() -> threading.Event:
    """An event that Ctrl-C and SIGTERM set: the rank's run ends at its next step."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


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
    stop = _stop_on_signals()
    own = rank_metrics(cfg, rank)
    metrics = TrainerMetrics(cfg.label, cfg.seed, cfg.incident, drill=cfg.drill, precision=cfg.precision)
    own_port = 0 if args.rank_port_base == 0 else args.rank_port_base + rank
    servers = [serve(own.registry, own_port, args.host, "--rank-port-base")]
    if rank == 0:  # the job's training metrics, where a one-process run serves them
        servers.append(serve(metrics.registry, args.port, args.host))
    for server in servers:
        host, port = server.server_address[:2]
        say(f"run {cfg.label} rank {rank}: serving http://{host}:{port}/metrics")
    record = RunRecord(run_dir / ("run.json" if rank == 0 else f"rank-{rank}.json"), cfg, public)
    fast_forward = 0 if args.attempt else args.fast_forward  # a restart is paced from its checkpoint
    trainer = RankTrainer(cfg, comm, own, stop, paced_from=fast_forward, attempt=args.attempt, log=say)
    if args.restart_from is not None:
        trainer.restore(args.restart_from)
        metrics.add_tokens(trainer.next_step * cfg.batch_size * cfg.tokens_per_example)
        if rank == 0:
            say(f"run {cfg.label}: restarted from {args.restart_from} at step {trainer.next_step}")
    # rank 0 asks Prometheus for the job's baselines, for all (Watch.agree)
    ready = baselines_ready(args.prometheus, cfg.label) if args.prometheus and rank == 0 else None
    try:
        status = run_live(
            cfg, metrics, record, fast_forward, stop, log=say if rank == 0 else lambda _line: None,
            trainer=trainer, checkpoints=run_dir / "checkpoints" if rank == 0 else None,
            watch=watch_of(args, servers, ready, trainer.agree),
            onset_moved=(lambda moved: seal_answer(args.sealed_answer, moved)) if cfg.drill and rank == 0 else None,
        )  # fmt: skip
    except JobFailedError as err:
        # As NCCL's watchdog does: end this process, and mpiexec ends every other rank.
        say(f"run {cfg.label} rank {rank}: {err}; ending the job")
        record.save(status="failed", ended_at=utc_now())
        os._exit(1)
    if rank == 0:
        say(f"run {cfg.label}: {status}")
    if status == "completed":
        stop.wait(args.hold)
    for server in servers:
        server.shutdown()
    if status not in ("completed", "drained"):  # drained: every rank halts at the same checkpoint
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

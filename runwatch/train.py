"""`runwatch train`: the live, exported run, or with --offline a timestamped OpenMetrics file.

runwatch train --incident corrupt_shard --seed 3            # live on :8000
runwatch train --incident random --fast-forward 250         # a drill: the incident is sealed
runwatch train --offline --out run.om --incident slow_node  # for promtool / the backtest
runwatch train --ranks 4 --incident straggler               # 4 ranks over MPI; rank r on :810r too
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import random
import secrets
import signal
import threading
import time
import zipfile
from pathlib import Path

from prometheus_client import CollectorRegistry

from runwatch.cluster import launcher as cluster
from runwatch.core.command import Command, UsageError, check_writable, config_error, number
from runwatch.core.files import write_atomic
from runwatch.core.names import LAUNCHER_PORT, LOOPBACK, PORTS, RANK_PORT_BASE, WATCH_GRACE_S
from runwatch.drill.answer import answer_path, seal_answer
from runwatch.exporter.metrics import HIDDEN, TrainerMetrics
from runwatch.exporter.server import MetricsServer, PortInUseError, start
from runwatch.prom.server import baselines_ready
from runwatch.trainer.config import (
    CLUSTER_INCIDENTS,
    INCIDENTS,
    MAX_LR,
    MAX_RANKS,
    MAX_SEED,
    MAX_STEPS,
    SEED,
    STEP,
    ConfigError,
    TrainConfig,
    draw_drill,
    parse_incident,
)
from runwatch.trainer.live import RunRecord, run_live, unique_run_id, watch_of
from runwatch.trainer.offline import simulate, write_openmetrics
from runwatch.trainer.run import NonFiniteCheckpointError, Trainer
from runwatch.trainer.sealed import unseal

RANDOM = "random"


def add_arguments(p: argparse.ArgumentParser) -> Command:
    d = TrainConfig()
    p.add_argument(
        "--incident", default=None,
        help=f"one of {', '.join(INCIDENTS)}, or {RANDOM} for a drill; with --ranks, {', '.join(CLUSTER_INCIDENTS)}; "
        "INCIDENT:STRENGTH for a smaller one, e.g. lr_spike:0.1 (strength in (0, 1], 1 the plate's)",
    )  # fmt: skip
    p.add_argument("--seed", type=SEED, default=None,
                   help=f"seeds batches, held-out set, jitter (default {d.seed}; a drill draws its own)")  # fmt: skip
    p.add_argument("--steps", type=number(int, 1, MAX_STEPS), default=d.steps)
    p.add_argument("--onset", type=STEP, default=None, help=f"first incident step (default {d.onset})")
    p.add_argument(
        "--lr", type=number(float, 0, MAX_LR, low_open=True), default=None, help=f"SGD learning rate (default {d.lr})"
    )
    p.add_argument("--run-id", default="", help="label on every series (default INCIDENT-SEED, -HHMMSS when live)")
    p.add_argument(
        "--port", type=number(int, 0, 65535), default=PORTS["trainer"], help="/metrics port on 127.0.0.1 (live)"
    )
    p.add_argument("--host", default=LOOPBACK, help="address to serve /metrics on (live)")
    p.add_argument("--fast-forward", type=STEP, default=0, metavar="STEP", help="train steps 0..STEP-1 unpaced first")
    p.add_argument("--run-dir", type=Path, default=None, help="where run.json goes (default runs/RUN_ID)")
    p.add_argument(
        "--hold", type=number(float, 0, 86400), default=None, metavar="SECONDS", help="keep serving after the run"
    )
    p.add_argument("--drill-seed", type=SEED, default=None, help="make --incident random reproducible")
    p.add_argument(
        "--sealed-answer", type=Path, default=None, metavar="FILE",
        help="--incident random with the incident and onset sealed in FILE (as `runwatch drill` writes it), "
        "so that neither shows in this command line",
    )  # fmt: skip
    p.add_argument(
        "--wait-for-prometheus", action="store_true",
        help="the lab's clock waits for its watcher: the first live step until Prometheus has scraped /metrics, "
        f"and every later one while it has not for {WATCH_GRACE_S:g} s (as the lab runs it)",
    )  # fmt: skip
    p.add_argument(
        "--prometheus", default=None, metavar="URL",
        help="with --wait-for-prometheus: the incident's onset waits until this Prometheus records the alerts' "
        "baselines for the run",
    )  # fmt: skip
    p.add_argument("--precision", choices=("fp64", "fp16"), default="fp64", help="fp16: mixed precision, loss scaling")
    p.add_argument(
        "--resume", type=Path, default=None, metavar="CHECKPOINT",
        help="go on from a saved checkpoint (its config, unless --lr or --incident say otherwise)",
    )  # fmt: skip
    add_cluster_arguments(p, d)
    p.add_argument("--offline", action="store_true", help="no HTTP, no pacing: write --out")
    p.add_argument("--out", type=Path, default=None, help="OpenMetrics file for --offline")
    return run


def add_cluster_arguments(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    """The flags of a run over several ranks (runwatch.cluster)."""
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=d.ranks,
        help="data-parallel ranks: live, one process each under mpiexec; offline, simulated in one",
    )  # fmt: skip
    p.add_argument(
        "--rank-port-base", type=number(int, 0, 65535 - MAX_RANKS), default=RANK_PORT_BASE, metavar="PORT",
        help=f"rank r serves its own /metrics on PORT + r (default {RANK_PORT_BASE}; 0: any free ports)",
    )  # fmt: skip
    p.add_argument(
        "--step-seconds", type=number(float, 0.001, 60), default=d.step_seconds, metavar="SECONDS",
        help="nominal device time of a step (default 1: the rules read one step per lab second; shorter for tests)",
    )  # fmt: skip
    p.add_argument(
        "--launcher-port", type=number(int, 0, 65535), default=LAUNCHER_PORT, metavar="PORT",
        help=f"with --ranks, the launcher serves restarts, lost steps and ETTR here (default {LAUNCHER_PORT})",
    )  # fmt: skip
    p.add_argument(
        "--watchdog-seconds", type=number(float, 0, 3600, low_open=True), default=d.watchdog_seconds,
        metavar="SECONDS", help="with --ranks, a rank ends the job after this long in one exchange (hang)",
    )  # fmt: skip
    p.add_argument(
        "--restart-seconds", type=number(float, 0, 3600, low_open=True), default=d.restart_seconds,
        metavar="SECONDS", help="with --ranks, the launcher restarts a failed job after this long",
    )  # fmt: skip
    p.add_argument(
        "--targets-dir", type=Path, default=None, metavar="DIR",
        help="write Prometheus's file_sd targets of the ranks and the launcher here (compose's shared volume)",
    )  # fmt: skip
    p.add_argument(
        "--targets-host", default=LOOPBACK, metavar="HOST", help="the host name in those targets (compose: trainer)"
    )
    # set by the launcher for the ranks of a restarted job
    p.add_argument("--attempt", type=number(int, 0, 1000), default=0, help=argparse.SUPPRESS)
    p.add_argument("--restart-from", type=Path, default=None, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, TrainConfig]:
    """(the true config, the one that may be shown); they differ only in a drill."""
    drill = args.incident == RANDOM
    onset = args.onset
    incident, strength = "none", 1.0
    if args.incident is not None and not drill:
        incident, strength = incident_of(args.incident)
    if args.sealed_answer is not None and not drill:
        raise UsageError("--sealed-answer: only with --incident random")
    if args.seed is not None and drill:
        raise UsageError("--seed: a drill (--incident random) draws its seed in secret; --drill-seed repeats a draw")
    if drill:
        if args.sealed_answer is not None:
            answer = read_sealed_answer(args.sealed_answer)
        else:
            seeded = args.drill_seed is not None
            rng = random.Random(args.drill_seed) if seeded else secrets.SystemRandom()
            answer = draw_drill(rng, cluster=args.ranks > 1)
        incident, strength = answer["incident"], answer.get("strength", 1.0)  # a hard drill's may be weaker
        if onset is None:
            onset = answer["onset"]
    # A drill trains the seed drawn with its answer, never one in argv: a known seed replays offline.
    seed = answer.get("seed", TrainConfig.seed) if drill else TrainConfig.seed if args.seed is None else args.seed
    cfg = TrainConfig(
        incident=incident,
        strength=strength,
        seed=seed,
        steps=args.steps,
        onset=TrainConfig.onset if onset is None else onset,
        lr=TrainConfig.lr if args.lr is None else args.lr,
        run_id=args.run_id,
        drill=drill,
        precision=args.precision,
        ranks=args.ranks,
        step_seconds=args.step_seconds,
        watchdog_seconds=args.watchdog_seconds,
        restart_seconds=args.restart_seconds,
    )
    try:
        cfg.validate()
    except ConfigError as err:
        if err.field == "onset" and 0 <= cfg.onset:
            raise UsageError(f"--steps: must be greater than --onset ({cfg.onset}), got {cfg.steps}") from None
        raise incident_error(err) from None
    public = hidden(cfg) if drill else cfg
    return cfg, public


def hidden(cfg: TrainConfig) -> TrainConfig:
    """What a drill's run may show of its config (run.json): not its incident, onset, seed or strength."""
    return dataclasses.replace(cfg, incident=HIDDEN, onset=-1, seed=-1, strength=1.0)  # a weaker one names its kind


def incident_of(text: str) -> tuple[str, float]:
    """--incident's INCIDENT or INCIDENT:STRENGTH, or a UsageError naming it."""
    try:
        return parse_incident(text)
    except ConfigError as err:
        raise UsageError(f"--incident: {err.problem}") from None


def incident_error(err: ConfigError) -> UsageError:
    """A config's error as the flag that sets the field; a strength's is --incident's."""
    return UsageError(f"--incident: {err.problem}") if err.field == "strength" else config_error(err)


def read_sealed_answer(path: Path) -> dict:
    try:
        answer = unseal(path)
    except OSError as err:
        raise UsageError(f"--sealed-answer: cannot read {path}: {err.strerror}") from None
    except ValueError as err:
        raise UsageError(f"--sealed-answer: {err}") from None
    if answer.get("incident") not in INCIDENTS + CLUSTER_INCIDENTS or not isinstance(answer.get("onset"), int):
        raise UsageError(f"--sealed-answer: {path} holds no incident and onset")
    if not isinstance(answer.get("seed", 0), int) or not 0 <= answer.get("seed", 0) <= MAX_SEED:
        raise UsageError(f"--sealed-answer: {path} holds a seed out of [0, {MAX_SEED}]")
    strength = answer.get("strength", 1.0)
    if isinstance(strength, bool) or not isinstance(strength, int | float) or not 0 < strength <= 1:
        raise UsageError(f"--sealed-answer: {path} holds a strength out of (0, 1]")
    return answer


def serve(registry: CollectorRegistry, port: int, host: str, flag: str = "--port") -> MetricsServer:
    """Serve a registry's /metrics, or a one-line UsageError naming the flag that chose the port."""
    try:
        return start(registry, port, host)
    except PortInUseError as err:
        raise UsageError(f"{flag}: {err}") from None
    except OSError as err:
        raise UsageError(f"--host: cannot listen on {host}:{port}: {err.strerror}") from None


def run_offline(cfg: TrainConfig, out: Path) -> int:
    check_writable(out, "--out")
    t0 = time.perf_counter()
    run = simulate(cfg)
    text = io.StringIO()  # one run is about 1 MB: built in memory, then written atomically
    n = write_openmetrics([run], text)
    write_atomic(out, text.getvalue())
    print(f"wrote {n} samples of run {cfg.label} to {out} in {time.perf_counter() - t0:.2f}s")
    return 0


def resume(args: argparse.Namespace) -> Trainer:
    """The trainer saved in --resume's checkpoint, with --lr or --incident changed if given:
    restarting from before trouble with a lower learning rate is what large runs did."""
    try:
        trainer = Trainer.from_checkpoint(args.resume)
    except FileNotFoundError:
        raise UsageError(f"--resume: no checkpoint at {args.resume}") from None
    except NonFiniteCheckpointError as err:
        raise UsageError(f"--resume: {err}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:  # empty, truncated, foreign
        raise UsageError(f"--resume: {args.resume} is not a runwatch checkpoint ({err})") from None
    if trainer.cfg.ranks > 1 or args.ranks > 1:
        raise UsageError("--resume: a run over several ranks cannot be resumed yet")
    changes: dict = {k: v for k, v in (("lr", args.lr), ("incident", args.incident)) if v is not None}
    if changes.get("incident") == RANDOM:
        raise UsageError("--incident: a resumed run cannot become a drill")
    if "incident" in changes:
        changes["incident"], changes["strength"] = incident_of(changes["incident"])
    if changes:
        try:
            trainer = trainer.retarget(dataclasses.replace(trainer.cfg, **changes))
        except ConfigError as err:
            raise incident_error(err) from None
    return trainer


def run(args: argparse.Namespace) -> int:
    resumed = resume(args) if args.resume is not None else None
    if resumed is not None:  # the run goes on as saved: its config, seed and incident
        cfg = resumed.cfg
        public = hidden(cfg) if cfg.drill else cfg
    else:
        cfg, public = config_from_args(args)
    if args.offline:
        if resumed is not None:
            raise UsageError("--resume: a resumed run is live; --offline always trains from step 0")
        if args.out is None:
            raise UsageError("--out: --offline needs a file to write")
        return run_offline(cfg, args.out)
    if args.out is not None:
        raise UsageError("--out: only with --offline")
    if resumed is None and not cfg.run_id:  # a live run of its own: never merged with an earlier one
        cfg = dataclasses.replace(cfg, run_id=unique_run_id(cfg.label))
        public = dataclasses.replace(public, run_id=cfg.run_id)
    run_dir = args.run_dir or Path("runs") / cfg.label
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        check_writable(run_dir / "run.json", "--run-dir")
    except OSError as err:
        raise UsageError(f"--run-dir: cannot create {run_dir}: {err.strerror}") from None
    if cluster.RANK_ENV not in os.environ and args.targets_dir is not None:
        cluster.write_targets(args, cfg)
    if cfg.ranks > 1 and cluster.RANK_ENV not in os.environ:  # the launcher: the ranks are mpiexec's
        return cluster.launch(args, cfg, run_dir, serve)
    if cfg.ranks > 1:
        return cluster.run_rank(args, cfg, public, run_dir, serve)
    # Ctrl-C and SIGTERM only ask the loop to stop, so run.json is always rewritten whole.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    metrics = TrainerMetrics(cfg.label, cfg.seed, cfg.incident, drill=cfg.drill, precision=cfg.precision)
    server = serve(metrics.registry, args.port, args.host)
    if cfg.drill:
        seal_answer(answer_path(run_dir), cfg)

    host, port = server.server_address[:2]
    print(f"run {cfg.label}: serving http://{host}:{port}/metrics; run.json in {run_dir}", flush=True)
    if resumed is not None:
        metrics.add_tokens(resumed.next_step * cfg.batch_size * cfg.tokens_per_example)
        print(f"run {cfg.label}: resumed from {args.resume} at step {resumed.next_step}", flush=True)
    ready = baselines_ready(args.prometheus, cfg.label) if args.prometheus else None
    status = run_live(
        cfg, metrics, RunRecord(run_dir / "run.json", cfg, public), args.fast_forward, stop,
        trainer=resumed, checkpoints=run_dir / "checkpoints", watch=watch_of(args, [server], ready),
        onset_moved=(lambda moved: seal_answer(answer_path(run_dir), moved)) if cfg.drill else None,
    )  # fmt: skip
    print(f"run {cfg.label}: {status}", flush=True)
    # A finished run keeps serving its last values, so Prometheus does not see the target die.
    if status == "completed":
        stop.wait(args.hold)
    server.shutdown()
    return 0 if status == "completed" else 130

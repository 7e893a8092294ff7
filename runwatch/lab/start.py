"""Starting the lab, for `runwatch up` (up.py) and `runwatch drill`: choose the lab's ports,
render its configuration, seal a drill's answer and start every component in order
(runwatch.lab.supervise's Lab), then watch them in the foreground until Ctrl-C or `runwatch
down`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time

from runwatch.cluster.targets import rank_targets
from runwatch.core.addresses import DEFAULT_PORTS, parse_ports
from runwatch.core.addresses import url as url_at
from runwatch.core.command import UsageError, config_error, state_flag
from runwatch.core.files import write_atomic
from runwatch.lab.processes import Interrupts
from runwatch.lab.supervise import Lab
from runwatch.prom.server import free_port, free_ports_in_a_row, port_is_free
from runwatch.trainer.config import CLUSTER_INCIDENTS, INCIDENTS, ConfigError, TrainConfig, parse_incident


def _port_owner_error(name: str, port: int) -> UsageError:
    return UsageError(
        f"port {port} is already in use ({name}): stop what holds it, `runwatch down` a lab, or move it with --ports"
    )


def choose_ports(asked: dict[str, int], ranks: int) -> dict[str, int]:
    """Every component's port: the documented one unless --ports names it, 0 being a free port
    (for the ranks, the first of `ranks` free ports in a row)."""
    ports = {**DEFAULT_PORTS, **asked}
    for name, port in ports.items():
        if port == 0:
            ports[name] = free_ports_in_a_row(ranks) if name == "ranks" else free_port()
    return ports


def add_ports(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ports", type=parse_ports, default={}, metavar="free|NAME=PORT,...",
        help=f"move components off their documented ports ({', '.join(DEFAULT_PORTS)}; 0: a free port), "
        "or `free` for all: labs in other state directories then run side by side",
    )  # fmt: skip


def check_run(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a run the trainer would refuse once started."""
    try:
        name, strength = ("none", 1.0) if args.incident == "random" else parse_incident(args.incident)
    except ConfigError as err:
        raise UsageError(f"--incident: {err.problem}") from None
    if name not in (*INCIDENTS, *CLUSTER_INCIDENTS, "none"):
        known = ", ".join((*INCIDENTS, *CLUSTER_INCIDENTS))
        raise UsageError(f"--incident: unknown incident {args.incident!r}; choose one of {known}, random")
    cfg = TrainConfig(incident=name, strength=strength, seed=args.seed, precision=args.precision, ranks=args.ranks)
    try:
        dataclasses.replace(cfg, onset=cfg.onset if args.onset is None else args.onset).validate()
    except ConfigError as err:
        raise (UsageError(f"--incident: {err.problem}") if err.field == "strength" else config_error(err)) from None


def up(args: argparse.Namespace) -> int:
    check_run(args)
    lab = Lab(args.state_dir, args.root)
    # `kill` stops the lab as Ctrl-C does, never orphaning it: while starting (start_lab stops
    # what had started) and in the foreground.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, Interrupts.handle)
    with lab.locked(wait=False):
        run_id = start_lab(lab, args)
    what = f"run {run_id}" if run_id else f"watching {', '.join(args.watch)}"
    print(f"{what}: pages with `runwatch pager --follow --log {lab.page_log}`; "
          f"stop with `runwatch down{state_flag(args.state_dir)}`")  # fmt: skip
    if args.detach:
        return 0
    try:
        while watch(lab):  # foreground: report a component that dies; end when `down` has stopped the lab
            time.sleep(1)
        print("runwatch up: the lab was stopped by `runwatch down`", flush=True)
    except KeyboardInterrupt:
        with lab.locked(wait=True):
            print("stopping:", ", ".join(lab.stop_all()) or "nothing was running", flush=True)
    return 0


def start_lab(lab: Lab, args: argparse.Namespace) -> str | None:
    """Start every component in order, under the lab's lock; on any failure stop what started."""
    running = [n for n, r in lab.records().items() if lab.alive(r)]
    if running:
        raise UsageError(f"a lab is already running in {lab.state} ({', '.join(running)}): `runwatch down` first")
    from runwatch.trainer.live import unique_run_id  # the trainer's, and numpy: `up` alone needs them

    watched = getattr(args, "watch", None)  # the user's job serves its own run id (runwatch.watch)
    label = "drill" if args.incident == "random" else f"{args.incident}-{args.seed}"
    run_id = None if watched else unique_run_id(label)
    lab.ports = ports = choose_ports(args.ports, args.ranks)
    comps = lab.components(args, run_id)  # finds the binaries first: a missing one says what to install
    for comp in comps:
        if not port_is_free(ports[comp.name]):
            raise _port_owner_error(comp.name, ports[comp.name])
    for rank in range(args.ranks if args.ranks > 1 else 0):  # one rank serves on the trainer's port
        if not port_is_free(ports["ranks"] + rank):
            raise _port_owner_error(f"trainer rank {rank}", ports["ranks"] + rank)
    if args.ranks > 1 and not port_is_free(ports["launcher"]):
        raise _port_owner_error("trainer launcher", ports["launcher"])
    for stale in lab.records():
        (lab.pids / f"{stale}.json").unlink()
    lab.link_config()
    trainers = watched or [lab.address("trainer")] + ([lab.address("control")] if args.control else [])
    lab.write_target("trainer", trainers)
    cluster = args.ranks > 1
    lab.write_groups("ranks", rank_targets(run_id, args.ranks, ports["ranks"]) if cluster else [])
    lab.write_target("launcher", [lab.address("launcher")] if cluster else [])
    for name in ("prometheus", "alertmanager", "pager"):
        lab.write_target(name, [lab.address(name)])
    if args.incident == "random":
        lab.seal_drill(run_id, args.drill_seed, args.seed, args.ranks, getattr(args, "difficulty", "normal"))
    # started_at: `runwatch pager` shows this lab's pages, not those of earlier labs; urls: where
    # every command that talks to this lab finds it (runwatch.core.addresses)
    urls = {name: lab.url(name) for name in ports}
    record = {"run_id": run_id, "root": str(lab.layout.root), "started_at": time.time(), "urls": urls}
    if watched:
        record["watch"] = watched
    write_atomic(lab.state / "lab.json", json.dumps(record) + "\n")
    print(f"console: {lab.url('console')}/ (the run, its pages and runbooks, ack and diagnose)", flush=True)
    try:
        for comp in comps:
            lab.start(comp)
            print(f"  {comp.name:13s} {comp.url}", flush=True)
        for rank in range(args.ranks if cluster else 0):  # the trainer's ranks and launcher: targets of their own
            print(f"  {f'rank {rank}':13s} {url_at(ports['ranks'] + rank)}/metrics", flush=True)
        if cluster:
            print(f"  {'launcher':13s} {lab.url('launcher')}/metrics", flush=True)
        for comp in comps:  # one that answered and then died (a trainer that failed on its first step)
            if not lab.alive(lab.records().get(comp.name, {})):
                raise UsageError(f"{comp.name} exited during start: {lab.log_tail(comp.name)}")
    except BaseException:
        lab.stop_all()
        raise
    return run_id


def watch(lab: Lab) -> bool:
    """Report each component that has died, once; False once the lab's PID files are gone."""
    try:
        with lab.locked(wait=False):  # not while `down` is stopping and removing them
            records = lab.records()
            for name, rec in records.items():
                if not lab.alive(rec) and not rec.get("reported") and "damaged" not in rec:
                    print(f"runwatch up: {name} exited; see {lab.logs / name}.log", file=sys.stderr, flush=True)
                    write_atomic(lab.pids / f"{name}.json", json.dumps({**rec, "reported": True}) + "\n")
    except UsageError:  # `down` holds the lock: look again in a second
        return True
    return bool(records)

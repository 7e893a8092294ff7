"""`runwatch up`: the native lab, without Docker. It starts, on loopback and with the
repository's own configuration files:

    trainer      http://127.0.0.1:8000/metrics   (runwatch train)
    pager        http://127.0.0.1:9095           (runwatch pager-serve)
    Alertmanager http://127.0.0.1:9093/api/v2/alerts (alertmanager or Debian's; with the lab's password)
    Prometheus   http://127.0.0.1:9090           (prometheus; `runwatch reload` sends it SIGHUP)
    console      http://127.0.0.1:9096/          (runwatch console: plate, pages, runbooks, ack)

How it starts them: start.py; what it starts, with which configuration, and how it is found
again: supervise.py. Those are the documented ports; `--ports` moves any of them, and every
command finds the lab's from its state directory (its lab.json). It stays in the foreground
until Ctrl-C unless --detach; `runwatch down` (down.py) stops it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runwatch.core.addresses import DEFAULT_PORTS
from runwatch.core.command import Command, add_state_dir, number
from runwatch.lab.start import add_ports, up
from runwatch.lab.watched import check_watch, watch_targets
from runwatch.trainer.config import MAX_RANKS, SEED, STEP


def add_arguments(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument(
        "--incident",
        default="none",
        help="incident for the trainer (INCIDENT:STRENGTH for a smaller one), or random for a drill",
    )
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--onset", type=STEP, default=None)
    p.add_argument("--fast-forward", type=STEP, default=0, metavar="STEP")
    control = DEFAULT_PORTS["control"]
    p.add_argument("--control", action="store_true", help=f"also run a healthy control trainer on :{control}")
    p.add_argument("--precision", choices=("fp64", "fp16"), default="fp64", help="fp16: mixed precision (Lesson 20)")
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=1,
        help=f"data-parallel ranks under MPI, rank r scraped on :{DEFAULT_PORTS['ranks']}+r (a cluster incident: 2+)",
    )  # fmt: skip
    add_ports(p)
    p.add_argument(
        "--watch", type=watch_targets, default=None, metavar="HOST:PORT[,...]|FILE",
        help="watch your own job (runwatch.watch) instead of starting the lab's trainer: its addresses, or a file "
        "of them, one a line",
    )  # fmt: skip
    p.add_argument("--detach", action="store_true", help="return once everything is ready")
    p.add_argument(
        "--no-wait-for-prometheus", action="store_true",
        help="the lab's clock runs on while Prometheus is away, as a real job's does (default: it waits, "
        "and holds the incident's onset until the alerts' baselines are recorded)",
    )  # fmt: skip
    p.add_argument("--drill-seed", type=SEED, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="configuration to run (default: the one `runwatch check` names)",
    )
    return up_or_watch


def up_or_watch(args: argparse.Namespace) -> int:
    if args.watch:
        check_watch(args)
    return up(args)

"""`runwatch plate`: the plate as a picture (readouts/picture.py), drawn from a live Prometheus.

runwatch plate --run corrupt_shard-0-083113 --out plate.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import requests

from runwatch.core.addresses import lab_url
from runwatch.core.command import Command, UsageError, check_writable, number, read_json
from runwatch.prom.server import PromQLError
from runwatch.readouts.picture import collect, draw, latest_run


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("--run", default=None, help="run_id to draw (default: the lab's run, else the newest)")
    p.add_argument("--state-dir", type=Path, default=Path(".runwatch"), help="the lab whose run is the default")
    p.add_argument("--prometheus", default=None, help="Prometheus to query (default: the lab's, from its state dir)")
    p.add_argument(
        "--since", type=number(float, 0, 30 * 24 * 60, low_open=True), default=20, metavar="MINUTES",
        help="how far back to look (default 20; at most Prometheus's 30 days)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="PNG file to write")
    return run


def run(args: argparse.Namespace) -> int:
    check_writable(args.out, "--out")
    base = (args.prometheus or lab_url(args.state_dir, "prometheus")).rstrip("/")
    try:
        requests.get(f"{base}/-/ready", timeout=3).raise_for_status()
    except requests.RequestException as err:
        raise UsageError(f"--prometheus: {base} is not answering ({type(err).__name__})") from None
    try:
        lab_json = args.state_dir / "lab.json"
        # a lab that watches a job of the user's (`up --watch`) records no run of its own: the newest
        run_id = args.run or (read_json(lab_json, "the lab's record").get("run_id") if lab_json.exists() else None)
        run_id = run_id or latest_run(base)
        data = collect(base, run_id, args.since * 60)
    except PromQLError as err:
        raise UsageError(f"--prometheus: {err}") from None
    draw(data, args.out)
    shown = ", ".join(f"{a} {'—' if s is None else s}" for a, s in data.readouts.items())
    print(f"wrote {args.out}: run {run_id}; first fired at: {shown}")
    return 0

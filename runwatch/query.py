"""`runwatch query`: run a PromQL query against the lab's Prometheus and print what it returns.

Debian's Prometheus 3 has no web UI, only its HTTP API, so the runbooks' first queries are run
here (in compose, Prometheus's own query page works as well):

    $ runwatch query 'runwatch_train_loss{run_id="corrupt_shard-0-101500"}'
    runwatch_train_loss{instance="127.0.0.1:8000", job="trainer", run_id="corrupt_shard-0-101500"}  0.2611

    $ runwatch query --range 10m --step 30s 'run:runwatch_train_loss:avg5s{run_id="RUN"}'
    run:runwatch_train_loss:avg5s{...}
      -9m30s  0.2743
      ...

An instant query prints one line per series; a range query prints each series, then its samples
by how long ago they were taken. Errors (a query Prometheus cannot parse, a Prometheus that does
not answer) are one line.
"""

from __future__ import annotations

import argparse
import math
import time

import requests

from runwatch.core.addresses import lab_url
from runwatch.core.command import Command, UsageError, add_state_dir
from runwatch.prom.server import PromQLError, instant, query_range
from runwatch.readouts.dashboard_queries import seconds

MAX_POINTS = 500  # a range query's samples per series that a terminal can still be read in


def series_name(metric: dict[str, str]) -> str:
    """name{label="value", ...} as Prometheus writes a series."""
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{metric.get('__name__', '')}{{{labels}}}"


def ago(seconds: float) -> str:
    whole = round(seconds)
    return "now" if whole <= 0 else f"-{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"-{whole}s"


def duration(text: str) -> int:
    """A flag's duration (30s, 10m, 1h) in whole seconds, more than none."""
    try:
        value = seconds(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 10m or 1h, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("expr", help="the PromQL expression")
    p.add_argument("--range", type=duration, default=None, metavar="DURATION", help="a range query: the last DURATION")
    p.add_argument("--step", type=duration, default=None, metavar="DURATION", help="its resolution (default: range/40)")
    add_state_dir(p)
    p.add_argument("--prometheus", default=None, help="Prometheus to query (default: the lab's, from its state dir)")
    return run


def run(args: argparse.Namespace) -> int:
    base = (args.prometheus or lab_url(args.state_dir, "prometheus")).rstrip("/")
    try:
        if args.range is None:
            for s in instant(base, args.expr):
                print(f"{series_name(s['metric'])}  {s['value'][1]}")
            return 0
        step = args.step or max(1, args.range // 40)
        if math.ceil(args.range / step) > MAX_POINTS:
            raise UsageError(f"--step: {args.range // step} samples a series; at most {MAX_POINTS} (a longer step)")
        end = time.time()
        for s in query_range(base, args.expr, end - args.range, end, step):
            print(series_name(s["metric"]))
            print("\n".join(f"  {ago(end - float(t)):>8s}  {v}" for t, v in s["values"]))
    except PromQLError as err:
        raise UsageError(f"expr: {err}") from None
    except requests.RequestException as err:
        raise UsageError(f"--prometheus: {base} did not answer ({type(err).__name__})") from None
    return 0

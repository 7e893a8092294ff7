"""`runwatch flight-recorder`: every rank's last collective and step, and the rank that lags.

    runwatch flight-recorder [--run ID] [--prometheus URL] [--state-dir DIR]

PyTorch's NCCL flight recorder keeps each rank's recent collectives, numbered by
`collective_seq_id`; its analyser (`torchfrtrace`) matches them across ranks and names the ranks
missing from a collective the others have entered. Here each rank serves its sequence number,
step and the time of its last finished step (exporter.rank_metrics); this reads them from
Prometheus, prints a line per rank, and names every rank behind the furthest one: the others
are waiting for it in the next exchange. The run is --run, else the lab's, else the newest run
with ranks.

Not an alert: TrainingStalled and StragglerRank page; this is what the on-call runs next.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from runwatch.core.addresses import lab_url
from runwatch.core.command import Command, UsageError, add_state_dir, read_json
from runwatch.exporter.rank_metrics import RANK_COLLECTIVE_SEQ, RANK_LAST_STEP_TIME, RANK_STEP
from runwatch.prom.server import PromQLError, instant, quoted


@dataclass(frozen=True)
class RankState:
    rank: int
    node: str
    seq: int
    step: int
    last_step_at: float  # Unix time


def read_ranks(prometheus: str, run_id: str) -> list[RankState]:
    """Every rank of the run as Prometheus last scraped it, in rank order. A series without an
    integer `rank` label, or a value that is not a finite number (anything may be pushed to
    Prometheus, or scraped from a hand-run exporter), is left out, never a traceback."""
    values: dict[str, dict[tuple[str, str], float]] = {}
    for name in (RANK_COLLECTIVE_SEQ, RANK_STEP, RANK_LAST_STEP_TIME):
        for s in instant(prometheus, f'{name}{{run_id="{quoted(run_id)}"}}'):
            rank, value = str(s["metric"].get("rank", "")), float(s["value"][1])
            if rank.isascii() and rank.isdigit() and math.isfinite(value):
                values.setdefault(name, {})[(rank, s["metric"].get("node", "?"))] = value
    seqs, steps, last = (values.get(n, {}) for n in (RANK_COLLECTIVE_SEQ, RANK_STEP, RANK_LAST_STEP_TIME))
    return [
        RankState(int(r), node, int(seqs[(r, node)]), int(steps.get((r, node), -1)), last.get((r, node), math.nan))
        for r, node in sorted(seqs, key=lambda k: int(k[0]))
    ]


def verdict(ranks: list[RankState]) -> list[str]:
    """The ranks behind the furthest, as the flight recorder's analyser reports a collective that
    not every rank has joined; one line if none lags. While a job runs, a rank may be a collective
    behind for a moment; one that stays behind while TrainingStalled fires is the hang."""
    ahead = max(r.seq for r in ranks)
    behind = [r for r in ranks if r.seq < ahead]
    if not behind:
        return [f"all {len(ranks)} ranks have entered collective {ahead}: none lags"]
    waiting = sorted({r.rank for r in ranks} - {r.rank for r in behind})
    return [
        f"rank {r.rank} on {r.node} has not entered collective {ahead} (its last is {r.seq}): "
        f"ranks {', '.join(map(str, waiting))} are waiting for it there"
        for r in behind
    ]


def newest_run_with_ranks(prometheus: str) -> str:
    found = instant(prometheus, f"max by (run_id) ({RANK_LAST_STEP_TIME})")
    if not found:
        raise UsageError(f"--run: Prometheus at {prometheus} has no run with ranks")
    return max(found, key=lambda s: float(s["value"][1]))["metric"]["run_id"]


def add_arguments(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--run", default=None, help="the run (default: the lab's, else the newest with ranks)")
    p.add_argument("--prometheus", default=None, help="Prometheus to read (default: the lab's, from its state dir)")
    return run


def run(args: argparse.Namespace) -> int:
    lab_json = args.state_dir / "lab.json"
    args.prometheus = args.prometheus or lab_url(args.state_dir, "prometheus")
    if args.run is None and lab_json.exists():
        args.run = read_json(lab_json, "the lab's record").get("run_id")
    try:
        run_id = args.run or newest_run_with_ranks(args.prometheus)
        ranks = read_ranks(args.prometheus, run_id)
    except (OSError, PromQLError) as err:
        raise UsageError(f"--prometheus: cannot read {args.prometheus}: {err}") from None
    if not ranks:
        raise UsageError(f"--run: run {run_id} has no ranks in Prometheus at {args.prometheus}")
    now = time.time()
    print(f"run {run_id}: {len(ranks)} ranks")
    print(f"{'rank':>4}  {'node':8s} {'collective':>10} {'step':>6}  last step")
    for r in ranks:
        ago = f"{now - r.last_step_at:.1f} s ago" if math.isfinite(r.last_step_at) else "never scraped"
        print(f"{r.rank:>4}  {r.node:8s} {r.seq:>10} {r.step:>6}  {ago}")
    print("\n".join(verdict(ranks)))
    return 0

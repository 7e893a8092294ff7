"""The gradient exchange's share of a step, live over MPI, at 2, 4 and 8 ranks on this machine.

    python benchmarks/bench_collective.py [--steps 30] [--step-seconds 1]

For each number of ranks, a healthy `runwatch train --ranks N` run (N rank processes under
mpiexec) and, once it is over, every rank's own /metrics: the seconds it spent in exchanges
(waiting for the slowest rank, the exchange itself, and the modelled 10 ms of it) against the
seconds of its steps. Then the same with every step unpaced (`--fast-forward` over the whole run):
no device time at all, so what is left is the arithmetic, and the exchange's real cost on 2 cores
where N processes share them.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families


def run(ranks: int, steps: int, step_seconds: float, unpaced: bool) -> dict[int, dict[str, float]]:
    """Every rank's metrics at the end of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "runwatch", "train", "--ranks", str(ranks), "--steps", str(steps),
                "--step-seconds", str(step_seconds), "--onset", "0", "--port", "0", "--rank-port-base", "0",
                "--run-id", "bench", "--run-dir", str(Path(tmp) / "run"), "--hold", "60"]  # fmt: skip
        if unpaced:
            argv += ["--fast-forward", str(steps)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        urls: dict[int, str] = {}
        try:
            for line in proc.stdout:
                m = re.match(r"run bench rank (\d+): serving (http://[0-9.:]+/metrics)$", line)
                if m and int(m[1]) not in urls:
                    urls[int(m[1])] = m[2]
                if "run bench: completed" in line:
                    break
            out = {}
            for rank, url in urls.items():
                text = requests.get(url, timeout=5).text
                out[rank] = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
            return out
        finally:
            proc.terminate()
            proc.communicate(timeout=60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-seconds", type=float, default=1.0)
    args = p.parse_args()
    print(f"healthy runs of {args.steps} steps; share of each rank's step time spent in the exchange")
    print(f"{'ranks':>5}  {'paced (' + str(args.step_seconds) + ' s steps)':>28}  {'unpaced':>28}")
    for ranks in (2, 4, 8):
        cells = []
        for unpaced in (False, True):
            ranks_metrics = run(ranks, args.steps, args.step_seconds, unpaced)
            shares = []
            for m in ranks_metrics.values():
                wait = m["runwatch_rank_collective_wait_seconds_total"]
                step = m["runwatch_rank_compute_seconds_total"] + wait
                shares.append(wait / step)
            cells.append(f"median {statistics.median(shares):.1%} (max {max(shares):.1%})")
        print(f"{ranks:>5}  {cells[0]:>28}  {cells[1]:>28}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

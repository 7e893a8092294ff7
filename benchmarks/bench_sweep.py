"""A sweep of 8 values against one warm backtest, side by side, on the same cached runs.

    python benchmarks/bench_sweep.py [--repeats 3] [--seeds 100-199] [--strengths 0.05-1]

Issue 31's target: `runwatch backtest --sweep ALERT=V1,...,V8` over the cached runs costs at
most 4 times one warm backtest. Both read the runs from the data cache (one cold backtest fills
it first, not timed), and neither finds its alert queries kept:

- one warm backtest: TrainingLossJump's threshold moved in a copy of the rules, to a value no
  earlier repeat used, so its query is evaluated and the other alerts' results are read back,
  as in the edit-and-see loop;
- the sweep: the shipped rules, with `--sweep TrainingLossJump=` eight values no earlier repeat
  used, so each variant is evaluated.

The two alternate, `--repeats` times each; the figures are wall-clock seconds of the whole
command, best and median, and the ratio of the medians. A ratio measured side by side holds on
a loaded machine better than either figure alone; re-measure on a quiet one for docs/figures.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OLD = "alertname: TrainingLossJump\n        expr: vector(3)\n"


def run(args: list[str], cache: Path) -> float:
    argv = [sys.executable, "-m", "runwatch", "backtest", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, env={**os.environ, "RUNWATCH_CACHE": str(cache)}
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_sweep: {' '.join(argv[3:])} failed: {proc.stderr.strip()[-500:]}")
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seeds", default="100-199")
    p.add_argument("--strengths", default="0.05-1")
    args = p.parse_args()
    common = ["--seeds", args.seeds, "--strengths", args.strengths]
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp_name:
        tmp, cache = Path(tmp_name), Path(tmp_name) / "cache"
        t0 = time.perf_counter()
        run(common, cache)
        print(f"cold backtest (fills the cache, not compared): {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        single, sweep = [], []
        for i in range(args.repeats):
            rules = tmp / f"rules-{i}"
            shutil.copytree(REPO / "prometheus" / "rules", rules)
            alerts = rules / "alerts.yml"
            text = alerts.read_text()
            if OLD not in text:
                raise SystemExit(f"bench_sweep: {alerts} no longer holds TrainingLossJump's threshold")
            alerts.write_text(text.replace(OLD, OLD.replace("vector(3)", f"vector({2.9 - i / 100:g})")))
            single.append(run([*common, "--rules", str(rules)], cache))
            values = ",".join(f"{v + i / 1000:g}" for v in (1.5, 2, 2.5, 3, 3.5, 4, 5, 6))
            sweep.append(run([*common, "--sweep", f"TrainingLossJump={values}"], cache))
            print(f"repeat {i + 1}: one warm backtest {single[-1]:.1f} s, a sweep of 8 values {sweep[-1]:.1f} s",
                  file=sys.stderr)  # fmt: skip
    ratio = statistics.median(sweep) / statistics.median(single)
    print(f"runwatch backtest {' '.join(common)}, {args.repeats} runs each, wall seconds (best / median)")
    print(f"one warm backtest (a threshold edited)   {min(single):5.1f} / {statistics.median(single):5.1f}")
    print(f"a sweep of 8 values (--sweep)            {min(sweep):5.1f} / {statistics.median(sweep):5.1f}")
    print(f"sweep / warm backtest, medians: {ratio:.2f}x (target at most 4x)")
    return 0 if ratio <= 4 else 1


if __name__ == "__main__":
    sys.exit(main())

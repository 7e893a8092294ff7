"""Does mixed precision learn as float64 does? The healthy run's loss at step 600, fp16 vs fp64.

    python benchmarks/bench_fp16.py [--seeds 100-199]

Target (issue 7): within 2% (median over seeds). Reports the held-out loss of the last
evaluation and the mean training loss of the last 10 steps, and the fp16 runs' skipped steps.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor

from runwatch.backtest.plan import parse_seeds
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import Trainer


def gaps(seed: int) -> tuple[float, float, int]:
    r64 = Trainer(TrainConfig(seed=seed)).run()
    r16 = Trainer(TrainConfig(seed=seed, precision="fp16")).run()
    held = abs(r16[-1].heldout_loss - r64[-1].heldout_loss) / r64[-1].heldout_loss
    last64 = sum(r.loss for r in r64[-10:]) / 10
    last16 = sum(r.loss for r in r16[-10:]) / 10
    return held, abs(last16 - last64) / last64, sum(r.skipped for r in r16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="100-199")
    seeds = parse_seeds(parser.parse_args().seeds)
    with ProcessPoolExecutor() as pool:
        results = list(pool.map(gaps, seeds))
    held, train, skipped = zip(*results, strict=True)
    print(f"{len(seeds)} healthy runs, fp16 against fp64 at step 600 (median relative difference):")
    print(f"  held-out loss:                     {100 * statistics.median(held):.2f}% (max {100 * max(held):.2f}%)")
    print(f"  training loss, mean of last 10:    {100 * statistics.median(train):.2f}% (max {100 * max(train):.2f}%)")
    print(f"  skipped steps per fp16 run:        median {statistics.median(skipped):g}, max {max(skipped)}")


if __name__ == "__main__":
    main()

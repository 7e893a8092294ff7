"""Where a healthy run sits against Lesson 20's expected curve (the power law fitted to its own
steps 10-150, extrapolated): the 5-step mean of the training loss, and the held-out loss, each
as a multiple of the curve, at steps 300 and 600.

    python benchmarks/bench_expected_curve.py [--seeds 100-199]

The curve is a guide, not a threshold (no alert reads it): this says how far from it a healthy
run wanders, so that a learner can tell a run that turns away from it from one that is merely
on the other side of it (issue 36).
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor

from runwatch.backtest.plan import parse_seeds
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import Trainer

STEPS = (300, 600)  # the plate's onset, and the run's last step (a step's record is that step - 1)


def ratios(seed: int) -> list[tuple[float, float]]:
    records = Trainer(TrainConfig(seed=seed)).run()
    out = []
    for step in STEPS:
        r = records[step - 1]
        mean5 = sum(x.loss for x in records[step - 5 : step]) / 5
        out.append((mean5 / r.expected_loss, r.heldout_loss / r.expected_loss))
    return out


def spread(xs: list[float]) -> str:
    xs = sorted(xs)
    at = lambda p: xs[round(p * (len(xs) - 1))]  # noqa: E731
    return f"median {statistics.median(xs):.2f}x, 5th-95th percentile {at(0.05):.2f}-{at(0.95):.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="100-199")
    seeds = parse_seeds(parser.parse_args().seeds)
    with ProcessPoolExecutor() as pool:
        results = list(pool.map(ratios, seeds))
    print(f"{len(seeds)} healthy runs against their own expected curve:")
    for i, step in enumerate(STEPS):
        print(f"  step {step}: training loss (5-step mean) {spread([r[i][0] for r in results])}")
        print(f"  step {step}: held-out loss            {spread([r[i][1] for r in results])}")


if __name__ == "__main__":
    main()

"""Unpaced steps per second with and without the exporter's updates, and /metrics render time.

    python benchmarks/bench_trainer.py

Targets (issue 2): instrumentation costs at most 5% of an unpaced step; a render takes < 1 ms.
"""

from __future__ import annotations

import statistics
import time

from prometheus_client import CollectorRegistry, generate_latest

from exporter.metrics import TrainerMetrics
from trainer.config import TrainConfig
from trainer.run import Trainer

REPEATS = 7


def step_and_observe_seconds() -> tuple[float, float]:
    """(seconds per unpaced step, seconds per exporter update) over one 600-step run.

    The updates are timed apart from the steps, on the same records: a difference of two
    noisy step timings would hide a cost of a few microseconds.
    """
    cfg = TrainConfig(incident="corrupt_shard")
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    records = trainer.run()
    step = (time.perf_counter() - t0) / cfg.steps
    metrics = TrainerMetrics(cfg.label, cfg.seed, cfg.incident, registry=CollectorRegistry())
    t0 = time.perf_counter()
    for rec in records:
        metrics.observe(rec, rec.tokens_per_second)
    return step, (time.perf_counter() - t0) / cfg.steps


def render_seconds() -> float:
    cfg = TrainConfig()
    trainer = Trainer(cfg)
    metrics = TrainerMetrics(cfg.label, cfg.seed, cfg.incident, registry=CollectorRegistry())
    for _ in range(20):
        rec = trainer.step()
        metrics.observe(rec, rec.tokens_per_second)
    samples = []
    for _ in range(2000):
        t0 = time.perf_counter()
        generate_latest(metrics.registry)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    runs = [step_and_observe_seconds() for _ in range(REPEATS)]
    step = statistics.median(r[0] for r in runs)
    update = statistics.median(r[1] for r in runs)
    print(f"unpaced step:                  {1e6 * step:8.1f} us  ({1 / step:6.0f} steps/s)")
    print(f"exporter update per step:      {1e6 * update:8.2f} us  ({1 / (step + update):6.0f} steps/s instrumented)")
    print(f"instrumentation cost:          {100 * update / step:8.2f} % of a step")
    print(f"/metrics render (median):      {1e3 * render_seconds():8.3f} ms")


if __name__ == "__main__":
    main()

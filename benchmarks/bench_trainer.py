"""Unpaced steps per second, the cost of instrumenting them, and /metrics render time.

Every figure is the best (minimum) of several repeats: on a shared 2-core machine the median
wanders by 15% from run to run, while the minimum is the cost of the code itself.

    python benchmarks/bench_trainer.py

Targets (issues 2 and 13): instrumentation costs at most 5% of an unpaced step; a render takes < 1 ms.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from runwatch.exporter.metrics import TrainerMetrics
from runwatch.trainer import model
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.record import activation_norms
from runwatch.trainer.run import Trainer, weight_norm

REPEATS = 7


def step_and_observe_seconds(precision: str = "fp64") -> tuple[float, float]:
    """(seconds per unpaced step, seconds per exporter update) over one 600-step run.

    The updates are timed apart from the steps, on the same records: a difference of two
    noisy step timings would hide a cost of a few microseconds.
    """
    cfg = TrainConfig(incident="corrupt_shard", precision=precision)
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    records = trainer.run()
    step = (time.perf_counter() - t0) / cfg.steps
    metrics = TrainerMetrics(cfg.label, cfg.seed, cfg.incident, registry=CollectorRegistry(), precision=precision)
    t0 = time.perf_counter()
    for rec in records:
        metrics.observe(rec, rec.tokens_per_second)
    return step, (time.perf_counter() - t0) / cfg.steps


def signals_seconds() -> tuple[float, float, float]:
    """Lesson 20's signals, timed apart on a real step's arrays, as the exporter update is:

    (seconds per step in the training step: the weight norm and the one-off power-law fit
    spread over a run; seconds for one batch's logit norms, read once per scrape by the live
    exporter; seconds per step for a whole run's logit norms in the offline writer's one pass).
    """
    t = Trainer(TrainConfig())
    recs = [t.step() for _ in range(150)]
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        weight_norm(t.w, t.b)
    per_step = (time.perf_counter() - t0) / n
    steps = np.arange(10, 150) + 1.0
    losses = np.array([r.loss for r in recs[10:150]])
    t0 = time.perf_counter()
    for _ in range(20):
        model.fit_power_law(steps, losses)
    per_step += (time.perf_counter() - t0) / 20 / t.cfg.steps
    logits = [r.logits for r in recs]
    t0 = time.perf_counter()
    for _ in range(2000):
        activation_norms(logits[:1])
    per_scrape = (time.perf_counter() - t0) / 2000
    t0 = time.perf_counter()
    for _ in range(50):
        activation_norms(logits)
    per_offline_step = (time.perf_counter() - t0) / 50 / len(logits)
    return per_step, per_scrape, per_offline_step


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
    step = min(r[0] for r in runs)
    update = min(r[1] for r in runs)
    timed = [signals_seconds() for _ in range(REPEATS)]
    signals, per_scrape, offline = (min(t[i] for t in timed) for i in range(3))
    step16 = min(step_and_observe_seconds("fp16")[0] for _ in range(3))
    print(
        f"unpaced step, float64:         {1e6 * step:8.1f} us  ({1 / step:6.0f} steps/s, Lesson 20's signals included)"
    )
    print(f"unpaced step, fp16 + scaler:   {1e6 * step16:8.1f} us  ({1 / step16:6.0f} steps/s)")
    print(f"exporter update per step:      {1e6 * update:8.2f} us")
    print(f"Lesson 20 signals per step:    {1e6 * signals:8.2f} us  (the weight norm, the fit spread over a run)")
    print(f"logit norms, once per scrape:  {1e6 * per_scrape:8.2f} us  (live: read by the exporter, not the step)")
    print(f"logit norms, offline per step: {1e6 * offline:8.2f} us  (a whole run in one pass)")
    print(
        f"instrumentation cost:          {100 * (update + signals) / (step - signals):8.2f} % of an uninstrumented step"
    )
    print(f"/metrics render (median):      {1e3 * render_seconds():8.3f} ms")  # of 2000 renders


if __name__ == "__main__":
    main()

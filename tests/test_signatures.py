"""Each incident leaves the plate's signature in the raw metrics, across 20 seeds.

These tests look at the trainer's own numbers, not at alerts: they show the data distribution
makes each signature real, with room to spare, so the PromQL rules have something to catch.
Alert firing is decided only by the rule files (see prometheus/tests and the backtest).
"""

import numpy as np
import pytest

from runwatch.trainer.batch import train_many
from runwatch.trainer.config import TrainConfig

SEEDS = range(20)
ONSET = 300


def series(recs: list) -> dict[str, np.ndarray]:
    return {
        "loss": np.array([r.loss for r in recs]),
        "grad": np.array([r.gradient_norm for r in recs]),
        "heldout": np.array([r.heldout_loss for r in recs]),
        "tps": np.array([r.tokens_per_second for r in recs]),
    }


@pytest.fixture(scope="module")
def runs():
    """Every incident over every seed, trained as one batched computation: bit for bit the runs
    runwatch.trainer.run.Trainer trains one by one (tests/test_batch.py), in a fraction of the time."""
    keys = [(i, s) for i in ("none", "lr_spike", "corrupt_shard", "repeated_batch", "slow_node") for s in SEEDS]
    trained = train_many([TrainConfig(incident=i, seed=s) for i, s in keys])
    return {key: series(recs) for key, recs in zip(keys, trained, strict=True)}


def steady(x: np.ndarray) -> float:
    """The run's usual level before the onset: the median of steps 200-299, long past the early
    descent. A fact about the data, not an alert's baseline (those are PromQL, in baselines.yml)."""
    return float(np.median(x[200:ONSET]))


def test_healthy_run_learns(runs):
    for s in SEEDS:
        r = runs["none", s]
        assert r["loss"][0] == pytest.approx(np.log(10))
        assert r["heldout"][-1] < 0.45
        assert r["heldout"][-1] < r["heldout"][0] / 5


def test_shuffled_labels_lift_the_gradient_norm_far_above_anything_a_healthy_run_shows(runs):
    healthy_peak = max(float(runs["none", s]["grad"][200:].max()) / steady(runs["none", s]["grad"]) for s in SEEDS)
    corrupt = [float(runs["corrupt_shard", s]["grad"][ONSET]) / steady(runs["corrupt_shard", s]["grad"]) for s in SEEDS]
    assert min(corrupt) > 2 * healthy_peak, (corrupt, healthy_peak)  # room for a threshold between them


def test_shuffled_shard_and_lr_spike_jump_the_loss(runs):
    for s in SEEDS:
        usual = steady(runs["none", s]["loss"])
        assert runs["corrupt_shard", s]["loss"][ONSET] > 10 * usual
        lr = runs["lr_spike", s]["loss"]
        assert lr[ONSET] == runs["none", s]["loss"][ONSET]  # the spiked update lands after step 300's loss
        assert max(lr[ONSET + 1], lr[ONSET + 2]) > 20 * usual


def test_repeated_batch_looks_better_than_ever_but_held_out_gives_it_away(runs):
    for s in SEEDS:
        r, h = runs["repeated_batch", s], runs["none", s]
        assert r["loss"][330:360].max() < r["loss"][:300].min()  # better than ever: memorising
        # held-out does not follow: it ends the repetition worse than before it, far above the batch
        assert r["heldout"][350] > r["heldout"][290], s
        assert r["heldout"][350] > 3 * np.median(r["loss"][330:360]), s
        # a healthy run's held-out loss never strays far from its batches' loss
        assert h["heldout"][100:].max() < 2 * np.median(h["loss"][100:]), s
        # fresh data after the repetition: the memorised model does worse than at any step of it
        assert r["loss"][360:363].max() > 3 * r["loss"][340:360].max(), s


def test_slow_node_changes_only_the_machine(runs):
    for s in SEEDS:
        slow, h = runs["slow_node", s], runs["none", s]
        assert np.array_equal(slow["loss"], h["loss"])
        assert np.array_equal(slow["grad"], h["grad"])
        ratio = np.median(slow["tps"][ONSET:]) / np.median(slow["tps"][:ONSET])
        assert ratio == pytest.approx(0.7, abs=0.01)
        assert slow["tps"][:ONSET].min() > 0.9 * np.median(slow["tps"][:ONSET])  # 2% jitter stays small

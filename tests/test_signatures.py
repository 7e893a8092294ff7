"""Each incident leaves the plate's signature in the raw metrics, across 20 seeds.

These tests look at the trainer's own numbers, not at alerts: they show the data distribution
makes each signature real, with room to spare, so the PromQL rules have something to catch.
Alert firing is decided only by the rule files (see prometheus/tests and the backtest).
"""

import numpy as np
import pytest

from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import Trainer

SEEDS = range(20)
ONSET = 300


def series(incident: str, seed: int) -> dict[str, np.ndarray]:
    recs = Trainer(TrainConfig(incident=incident, seed=seed)).run()
    return {
        "loss": np.array([r.loss for r in recs]),
        "grad": np.array([r.gradient_norm for r in recs]),
        "heldout": np.array([r.heldout_loss for r in recs]),
        "tps": np.array([r.tokens_per_second for r in recs]),
    }


@pytest.fixture(scope="module")
def runs():
    incidents = ["none", "lr_spike", "corrupt_shard", "repeated_batch", "slow_node"]
    return {(i, s): series(i, s) for i in incidents for s in SEEDS}


def trailing_mean(x: np.ndarray, s: int, window: int) -> float:
    return float(x[max(0, s - window) : s].mean())


def test_healthy_run_learns(runs):
    for s in SEEDS:
        r = runs["none", s]
        assert r["loss"][0] == pytest.approx(np.log(10))
        assert r["heldout"][-1] < 0.45
        assert r["heldout"][-1] < r["heldout"][0] / 5


def test_shuffled_shard_lifts_gradient_norm_well_above_3x_its_running_mean(runs):
    def ratio(incident: str, s: int, t: int) -> float:
        grad = runs[incident, s]["grad"]
        return grad[t] / trailing_mean(grad, t, 60)

    healthy_peak = max(ratio("none", s, t) for s in SEEDS for t in range(70, 600))
    corrupt = [ratio("corrupt_shard", s, ONSET) for s in SEEDS]
    assert min(corrupt) > 4.0, corrupt
    assert healthy_peak < 2.5, healthy_peak  # a healthy run does not come near 3x


def test_shuffled_shard_and_lr_spike_jump_the_loss(runs):
    for s in SEEDS:
        base = trailing_mean(runs["none", s]["loss"], ONSET, 30)
        assert runs["corrupt_shard", s]["loss"][ONSET] > 10 * base
        lr = runs["lr_spike", s]["loss"]
        assert lr[ONSET] == runs["none", s]["loss"][ONSET]  # the spiked update lands after step 300's loss
        assert max(lr[ONSET + 1], lr[ONSET + 2]) > 20 * base


def test_repeated_batch_looks_better_than_ever_but_held_out_gives_it_away(runs):
    for s in SEEDS:
        r, h = runs["repeated_batch", s], runs["none", s]
        assert r["loss"][330:360].max() < r["loss"][:300].min()  # better than ever: memorising
        gap = r["heldout"][340] / r["loss"][330:340].mean()
        assert gap > 3.0, (s, gap)
        healthy_gaps = [h["heldout"][t] / h["loss"][t - 10 : t].mean() for t in range(60, 600, 10)]
        assert max(healthy_gaps) < 2.0, (s, max(healthy_gaps))
        # fresh data after the repetition: the memorised model does worse than before it
        assert r["loss"][360:363].mean() > 3 * r["loss"][350:360].mean()


def test_slow_node_changes_only_the_machine(runs):
    for s in SEEDS:
        slow, h = runs["slow_node", s], runs["none", s]
        assert np.array_equal(slow["loss"], h["loss"])
        assert np.array_equal(slow["grad"], h["grad"])
        ratio = np.median(slow["tps"][ONSET:]) / np.median(slow["tps"][:ONSET])
        assert ratio == pytest.approx(0.7, abs=0.01)
        assert slow["tps"][:ONSET].min() > 0.9 * np.median(slow["tps"][:ONSET])  # 2% jitter stays small

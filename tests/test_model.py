"""The model's maths and the run's determinism."""

import numpy as np
import pytest

from runwatch.trainer import model
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import Trainer, get_batch, step_durations


def same(a: list, b: list) -> bool:
    """Records equal field by field, bit for bit (repr round-trips floats), NaN equal to NaN."""
    return [repr(r) for r in a] == [repr(r) for r in b]


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    cfg = TrainConfig()
    x, y = model.sample(rng, model.class_means(cfg), 16, cfg.noise)
    w, b = rng.normal(0, 0.1, (cfg.features, cfg.classes)), rng.normal(0, 0.1, cfg.classes)
    _, g_w, g_b = model.loss_and_grad(w, b, x, y)
    eps = 1e-6
    for i, j in [(0, 0), (3, 7), (19, 9), (10, 2)]:
        wp, wm = w.copy(), w.copy()
        wp[i, j] += eps
        wm[i, j] -= eps
        numeric = (model.loss(wp, b, x, y) - model.loss(wm, b, x, y)) / (2 * eps)
        assert g_w[i, j] == pytest.approx(numeric, rel=1e-5, abs=1e-9)
    for j in range(cfg.classes):
        bp, bm = b.copy(), b.copy()
        bp[j] += eps
        bm[j] -= eps
        numeric = (model.loss(w, bp, x, y) - model.loss(w, bm, x, y)) / (2 * eps)
        assert g_b[j] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_loss_at_zero_weights_is_log_classes():
    cfg = TrainConfig()
    x, y = model.sample(np.random.default_rng(0), model.class_means(cfg), 64, cfg.noise)
    assert model.loss(np.zeros((20, 10)), np.zeros(10), x, y) == pytest.approx(np.log(10))


@pytest.mark.parametrize("incident", ["none", "lr_spike", "corrupt_shard", "repeated_batch", "slow_node"])
def test_same_seed_same_series_bit_for_bit(incident):
    a = Trainer(TrainConfig(incident=incident, seed=5, steps=320)).run()
    b = Trainer(TrainConfig(incident=incident, seed=5, steps=320)).run()
    assert same(a, b)


def test_other_seed_other_series():
    a = Trainer(TrainConfig(seed=1, steps=20, onset=10)).run()
    b = Trainer(TrainConfig(seed=2, steps=20, onset=10)).run()
    assert [r.loss for r in a] != [r.loss for r in b]


def test_incident_runs_share_the_healthy_prefix():
    healthy = Trainer(TrainConfig(seed=3, steps=320)).run()
    for incident in ["lr_spike", "corrupt_shard", "repeated_batch", "slow_node"]:
        run = Trainer(TrainConfig(incident=incident, seed=3, steps=320)).run()
        assert [r.loss for r in run[:300]] == [r.loss for r in healthy[:300]], incident


def test_fork_at_the_onset_equals_a_fresh_run():
    prefix = Trainer(TrainConfig(seed=6))
    for _ in range(300):
        prefix.step()
    for incident in ["lr_spike", "corrupt_shard", "repeated_batch", "slow_node"]:
        cfg = TrainConfig(incident=incident, seed=6)
        assert same(prefix.fork(cfg).run(), Trainer(cfg).run()[300:]), incident


def test_fork_refuses_another_seed_or_a_step_past_the_onset():
    t = Trainer(TrainConfig(seed=1))
    with pytest.raises(ValueError, match="only in their incident"):
        t.fork(TrainConfig(seed=2, incident="lr_spike"))
    for _ in range(301):
        t.step()
    with pytest.raises(ValueError, match="past the onset"):
        t.fork(TrainConfig(seed=1, incident="lr_spike"))


def test_repeated_batch_feeds_the_onsets_batch():
    cfg = TrainConfig(incident="repeated_batch")
    means = model.class_means(cfg)
    first = get_batch(cfg, means, 300)
    for s in (301, 330, 359):
        x, y = get_batch(cfg, means, s)
        assert np.array_equal(x, first[0]) and np.array_equal(y, first[1])
    assert not np.array_equal(get_batch(cfg, means, 360)[0], first[0])


def test_corrupt_shard_shuffles_labels_only_in_its_window():
    cfg, healthy = TrainConfig(incident="corrupt_shard"), TrainConfig()
    means = model.class_means(cfg)
    for s, shuffled in [(299, False), (300, True), (329, True), (330, False)]:
        (xc, yc), (xh, yh) = get_batch(cfg, means, s), get_batch(healthy, means, s)
        assert np.array_equal(xc, xh)
        assert sorted(yc) == sorted(yh)
        assert (not np.array_equal(yc, yh)) == shuffled, s


def test_step_duration_jitter_and_slow_node():
    cfg = TrainConfig(incident="slow_node")
    durations = step_durations(cfg)
    before, after = durations[:300], durations[300:]
    assert np.std(np.log(before)) == pytest.approx(0.02, rel=0.2)
    assert np.median(after) / np.median(before) == pytest.approx(1 / 0.7, rel=0.02)

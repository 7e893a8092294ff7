"""Lesson 20's signals: the loss scaler, the expected curve, checkpoints, and what they show."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from runwatch.trainer import model
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import Trainer
from tests.conftest import free_port

SEEDS = range(10)


def same(a: list, b: list) -> bool:
    return [repr(r) for r in a] == [repr(r) for r in b]


def test_the_scaler_follows_gradscaler_on_a_hand_worked_sequence():
    t = Trainer(TrainConfig(precision="fp16", loss_scale_init=8.0, loss_scale_growth_interval=3))
    trace = []
    for overflow in [False, False, False, True, False, True, False, False, False, False]:
        t._update_scale(overflow)
        trace.append((t.scale, t.clean_steps, t.skipped_steps))
    assert trace == [
        (8.0, 1, 0), (8.0, 2, 0), (16.0, 0, 0),  # three clean steps: grow
        (8.0, 0, 1),  # overflow: back off, skip, reset the tracker
        (8.0, 1, 1), (4.0, 0, 2),  # one clean step, then an overflow again
        (4.0, 1, 2), (4.0, 2, 2), (8.0, 0, 2), (8.0, 1, 2),
    ]  # fmt: skip


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    t = Trainer(TrainConfig(precision="fp16"))
    for _ in range(5):
        t.step()
    w, b = t.w.copy(), t.b.copy()
    t.scale = 2.0**24  # scale / batch overflows float16 in the backward pass
    rec = t.step()
    assert rec.skipped and rec.loss_scale == 2.0**24 and t.scale == 2.0**23
    assert np.array_equal(t.w, w) and np.array_equal(t.b, b)
    assert rec.gradient_norm > 0  # still measured, in float64, for the monitor
    assert t.w.dtype == np.float32  # master weights stay float32


def test_power_law_fit_recovers_known_parameters():
    t = np.arange(10, 150) + 1.0
    a, b, c = model.fit_power_law(t, 3.0 * t**-0.8 + 0.25)
    assert (a, b, c) == pytest.approx((3.0, 0.8, 0.25), rel=1e-3)
    noisy = 3.0 * t**-0.8 + 0.25 + np.random.default_rng(1).normal(0, 0.005, len(t))
    assert model.fit_power_law(t, noisy) == pytest.approx((3.0, 0.8, 0.25), rel=0.1)


def test_the_expected_curve_appears_after_its_fit_window():
    recs = Trainer(TrainConfig(seed=3)).run()
    assert all(np.isnan(r.expected_loss) for r in recs[:149])
    expected = np.array([r.expected_loss for r in recs[149:]])
    assert np.all(np.isfinite(expected)) and np.all(np.diff(expected) <= 1e-12)  # a power law only falls
    actual = np.array([r.loss for r in recs[149:]])
    assert abs(np.median(actual) - np.median(expected)) < 0.2  # a healthy run stays near its curve


@pytest.mark.parametrize("precision", ["fp64", "fp16"])
def test_resume_from_a_checkpoint_gives_the_uninterrupted_series(tmp_path, precision):
    cfg = TrainConfig(incident="lr_spike", seed=4, precision=precision)
    t = Trainer(cfg)
    for _ in range(120):  # before the fit window closes: its losses travel in the checkpoint
        t.step()
    path = t.save_checkpoint(tmp_path)
    rest = t.run()
    assert same(Trainer.from_checkpoint(path).run(), rest)
    assert same(rest, Trainer(cfg).run()[120:])


def test_only_the_last_m_checkpoints_are_kept(tmp_path):
    t = Trainer(TrainConfig(checkpoint_keep=3))
    for _ in range(5):
        for _ in range(10):
            t.step()
        t.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-000029.npz", "checkpoint-000039.npz", "checkpoint-000049.npz"
    ]  # fmt: skip


def test_mixed_precision_learns_as_float64_does():
    """The fp16 run's healthy loss at step 600 is within 2% of float64's (median over seeds)."""
    gaps = []
    for seed in SEEDS:
        end64 = Trainer(TrainConfig(seed=seed)).run()[-1].heldout_loss
        end16 = Trainer(TrainConfig(seed=seed, precision="fp16")).run()[-1].heldout_loss
        gaps.append(abs(end16 - end64) / end64)
    assert np.median(gaps) < 0.02, gaps


def rolling_median_ratio(scale: np.ndarray, s: int) -> float:
    return scale[s] / np.median(scale[max(0, s - 60) : s + 1])


@pytest.mark.slow  # a lab of its own for most of a minute: the slow tier keeps make test within 5 minutes
def test_a_learning_rate_spike_collapses_the_loss_scale_and_a_healthy_run_does_not():
    collapsed = 0
    for seed in SEEDS:
        spike = np.array(
            [r.loss_scale for r in Trainer(TrainConfig(incident="lr_spike", seed=seed, precision="fp16")).run()]
        )
        collapsed += min(rolling_median_ratio(spike, s) for s in range(300, 310)) <= 0.25
        healthy = np.array([r.loss_scale for r in Trainer(TrainConfig(seed=seed, precision="fp16")).run()])
        assert min(rolling_median_ratio(healthy, s) for s in range(60, 600)) >= 0.5
    assert collapsed >= 7


def test_a_learning_rate_spike_lifts_the_activation_norm():
    for seed in SEEDS:
        recs = Trainer(TrainConfig(incident="lr_spike", seed=seed)).run()
        before = np.mean([r.logit_norm_max for r in recs[240:300]])
        assert recs[301].logit_norm_max > 4 * before
        assert recs[301].weight_norm > 2 * recs[299].weight_norm


@pytest.mark.integration
def test_resume_on_the_command_line(tmp_path):
    t = Trainer(TrainConfig(incident="corrupt_shard", seed=2))
    for _ in range(598):
        t.step()
    path = t.save_checkpoint(tmp_path / "ck")
    res = subprocess.run(
        [sys.executable, "-m", "runwatch", "train", "--resume", str(path), "--port", str(free_port()),
         "--run-dir", str(tmp_path / "run"), "--hold", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "resumed from" in res.stdout and "at step 598" in res.stdout
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (record["status"], record["last_step"], record["config"]["incident"]) == ("completed", 599, "corrupt_shard")
    lowered = subprocess.run(
        [sys.executable, "-m", "runwatch", "train", "--resume", str(path), "--lr", "0.05", "--incident", "none",
         "--port", str(free_port()), "--run-dir", str(tmp_path / "run2"), "--hold", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert lowered.returncode == 0, lowered.stderr
    config = json.loads((tmp_path / "run2" / "run.json").read_text())["config"]
    assert (config["lr"], config["incident"], config["seed"]) == (0.05, "none", 2)
    bad = subprocess.run(
        [sys.executable, "-m", "runwatch", "train", "--resume", str(tmp_path / "nope.npz")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == f"runwatch train: --resume: no checkpoint at {tmp_path / 'nope.npz'}"
    )

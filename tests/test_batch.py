"""The backtest's batched trainer: every lane is, bit for bit, the run `runwatch train --offline` writes."""

import dataclasses
import io
import subprocess
import sys

import numpy as np
import pytest

from runwatch.trainer import model
from runwatch.trainer.batch import log_softmax_by_class, train_columns, train_many
from runwatch.trainer.config import INCIDENTS, MAX_SEED, TrainConfig
from runwatch.trainer.offline import OfflineRun, write_openmetrics
from runwatch.trainer.run import Trainer, corrupt_labels


def same_records(a, b) -> list[str]:
    """The fields in which two runs' records differ, bit for bit (NaN equals NaN; logits compared too)."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if f.name == "logits":
                if not np.array_equal(u, v):
                    diffs.append(f"step {x.step}: logits")
            elif not (u == v or (u != u and v != v)) or type(u) is not type(v):
                diffs.append(f"step {x.step}: {f.name} {u!r} != {v!r}")
    return diffs


# A sample of seeds, the largest included, each with every incident: 15 runs batched together.
SEEDS = (0, 137, MAX_SEED)


def test_every_lane_is_the_one_run_trainer_bit_for_bit():
    configs = [TrainConfig(seed=s, incident=i) for s in SEEDS for i in INCIDENTS]
    for cfg, records in zip(configs, train_many(configs), strict=True):
        assert same_records(Trainer(cfg).run(), records) == [], cfg.label


# The weakest strength a backtest draws and one between, on every incident that has one, beside
# the plate's: several strengths of one incident and seed in one batch, as --strengths trains them.
STRENGTHS = (0.05, 0.37, 1.0)


def test_every_strength_is_the_one_run_trainer_bit_for_bit():
    configs = [TrainConfig(seed=137, incident=i, strength=x) for i in INCIDENTS if i != "none"
               for x in STRENGTHS] + [TrainConfig(seed=137)]  # fmt: skip
    for cfg, records in zip(configs, train_many(configs), strict=True):
        assert same_records(Trainer(cfg).run(), records) == [], cfg.label


def test_a_strength_makes_a_smaller_incident_on_its_scale():
    full, tenth = (Trainer(TrainConfig(incident="lr_spike", strength=x)).run() for x in (1.0, 0.1))
    assert full[300].lr == 0.1 * 150 and tenth[300].lr == pytest.approx(0.1 * 150**0.1)
    repeated = Trainer(TrainConfig(incident="repeated_batch", strength=0.25)).run()
    assert sum(r.incident_active for r in repeated) == 15
    slow = Trainer(TrainConfig(incident="slow_node", strength=0.27, jitter_sigma=0.0)).run()
    assert slow[400].duration_seconds == pytest.approx(1 / (1 - 0.27 * 0.3))
    # a fifth of a shard's labels shuffled: the batch differs from the clean one in at most 13 of 64
    cfg = TrainConfig(incident="corrupt_shard", strength=0.2)
    y = np.arange(64) % 10
    changed = corrupt_labels(cfg, 300, y) != y
    assert 0 < changed.sum() <= 13 and sorted(corrupt_labels(cfg, 300, y)) == sorted(y)


@pytest.mark.integration
# one of them through the command line: the lanes' arithmetic is checked at every strength above,
# and the writer reads a weaker lane as any other
@pytest.mark.parametrize("incident", ["repeated_batch:0.3"])
def test_a_weaker_lane_writes_the_file_runwatch_train_offline_writes(tmp_path, incident):
    name, strength = incident.split(":")
    cfg = TrainConfig(seed=137, incident=name, strength=float(strength))
    out = tmp_path / "run.om"
    proc = subprocess.run(
        [sys.executable, "-m", "runwatch", "train", "--offline", "--out", str(out), "--seed", "137",
         "--incident", incident], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lanes = train_columns([TrainConfig(seed=137), cfg, dataclasses.replace(cfg, strength=1.0)])
    buffer = io.StringIO()
    write_openmetrics([OfflineRun(cfg, lanes[1])], buffer)
    assert buffer.getvalue() == out.read_text()
    assert f'run_id="{name}:{strength}-137"' in buffer.getvalue()


@pytest.mark.integration
def test_a_lane_writes_the_file_runwatch_train_offline_writes(tmp_path):
    """Field by field, as the backtest reads its lanes (train_columns), without a record per step."""
    cfg = TrainConfig(seed=137, incident="repeated_batch")
    out = tmp_path / "run.om"
    proc = subprocess.run(
        [sys.executable, "-m", "runwatch", "train", "--offline", "--out", str(out), "--seed", "137",
         "--incident", "repeated_batch"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lane = train_columns([TrainConfig(seed=137), cfg])[1]
    buffer = io.StringIO()
    write_openmetrics([OfflineRun(cfg, lane)], buffer)
    assert buffer.getvalue() == out.read_text()


def test_fp16_runs_are_trained_one_by_one_and_match_too():
    configs = [TrainConfig(seed=3, incident=i, precision="fp16", steps=320) for i in ("none", "lr_spike")]
    for cfg, records in zip(configs, train_many(configs), strict=True):
        assert same_records(Trainer(cfg).run(), records) == []


def test_the_order_of_the_configs_is_kept():
    configs = [TrainConfig(seed=2, incident="slow_node", steps=310), TrainConfig(seed=1, steps=310)]
    runs = train_many(configs)
    assert same_records(Trainer(configs[0]).run(), runs[0]) == []
    assert same_records(Trainer(configs[1]).run(), runs[1]) == []


def test_configs_that_differ_in_more_than_seed_and_incident_are_refused():
    with pytest.raises(ValueError, match="only in seed, incident and strength"):
        train_many([TrainConfig(seed=1), TrainConfig(seed=2, lr=0.2)])
    assert train_many([]) == []


@pytest.mark.parametrize("classes", [2, 7, 8, 10, 16, 17, 37, 128, 130])
def test_the_plane_by_plane_log_softmax_is_the_models_bit_for_bit(classes):
    rng = np.random.default_rng(classes)
    logits = rng.normal(0.0, 8.0, size=(7, 64, classes))
    logits[0, 0, 0] = 700.0  # an exponent near overflow, and a row of equal logits
    logits[1, 1, :] = 3.25
    assert np.array_equal(np.moveaxis(log_softmax_by_class(logits), 0, -1), model.log_softmax(logits))


def test_an_onset_at_step_0_has_no_prefix_to_share():
    configs = [TrainConfig(seed=1, onset=0, steps=20, incident=i) for i in ("none", "lr_spike")]
    for cfg, records in zip(configs, train_many(configs), strict=True):
        assert same_records(Trainer(cfg).run(), records) == []

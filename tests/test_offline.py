"""Offline runs: OpenMetrics on the lab clock that promtool loads into a real TSDB."""

import io
import subprocess

import numpy as np
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from runwatch.trainer.config import TrainConfig
from runwatch.trainer.offline import DEFAULT_START, simulate, write_openmetrics
from tests.conftest import need


def render(*cfgs: TrainConfig) -> str:
    buf = io.StringIO()
    write_openmetrics([simulate(c) for c in cfgs], buf)
    return buf.getvalue()


def test_file_parses_as_openmetrics_with_the_runs_labels():
    text = render(TrainConfig(incident="slow_node", seed=1, steps=40, onset=20))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    step = fams["runwatch_train_step"].samples
    assert len(step) == 40
    assert step[0].labels == {"job": "trainer", "instance": "offline/slow_node-1", "run_id": "slow_node-1"}
    info = fams["runwatch_train_run_info"].samples[0].labels
    assert (info["incident"], info["seed"]) == ("slow_node", "1")
    assert fams["runwatch_train_tokens"].type == "counter"


def test_slow_node_steps_are_spaced_by_the_lab_clock():
    text = render(TrainConfig(incident="slow_node", seed=2))
    step = {f.name: f for f in text_string_to_metric_families(text)}["runwatch_train_step"].samples
    t = np.array([float(s.timestamp) for s in step])
    gaps = np.diff(t)
    assert np.median(gaps[:299]) == np.float64(1.0) or abs(np.median(gaps[:299]) - 1.0) < 0.01
    assert abs(np.median(gaps[300:]) - 1 / 0.7) < 0.02
    assert t[0] > DEFAULT_START


def test_same_seed_same_file():
    assert render(TrainConfig(seed=4, steps=50, onset=10)) == render(TrainConfig(seed=4, steps=50, onset=10))


def test_drill_offline_hides_the_incident():
    text = render(TrainConfig(incident="corrupt_shard", seed=1, steps=30, onset=10, drill=True))
    assert "corrupt_shard" not in text and "incident_active" not in text and 'incident="hidden"' in text


@pytest.mark.integration
def test_promtool_backfills_the_file(tmp_path):
    om = tmp_path / "runs.om"
    with open(om, "w") as fh:
        written = write_openmetrics(
            [simulate(TrainConfig(incident="lr_spike", seed=1)), simulate(TrainConfig(seed=1))], fh
        )
    out = subprocess.run(
        [need("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp_path / "data")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    listing = subprocess.run(
        [need("promtool"), "tsdb", "list", str(tmp_path / "data")], capture_output=True, text=True, check=True
    ).stdout
    rows = [ln.split() for ln in listing.splitlines()[1:] if ln.strip()]
    assert sum(int(r[4]) for r in rows) == written  # every sample written landed in the TSDB
    assert written > 2 * 13 * 600


@pytest.mark.integration
def test_a_cluster_run_writes_each_rank_and_its_gpu(tmp_path):
    """Over 4 ranks the file also holds what each rank's exporter serves: a straggler computes
    1/0.7 longer from the onset and waits least; the others wait for it."""
    text = render(TrainConfig(incident="straggler", ranks=4, seed=3, steps=40, onset=10))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    compute = {}
    for s in fams["runwatch_rank_last_compute_seconds"].samples:
        compute.setdefault(s.labels["rank"], []).append(s.value)
    assert sorted(compute) == ["0", "1", "2", "3"] and all(len(v) == 40 for v in compute.values())
    slow = max(compute, key=lambda r: compute[r][-1])
    assert all(abs(compute[slow][s] / compute[r][s] - 1 / 0.7) < 0.15 for r in compute if r != slow for s in (20, 39))
    ups = [s for s in fams["up"].samples if s.labels["job"] == "ranks"]
    assert {s.labels["instance"] for s in ups} == {f"offline/straggler-3/rank{r}" for r in range(4)}
    clocks = {s.labels["Hostname"] + "/" + s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_SM_CLOCK"].samples}
    assert sorted(clocks) == ["node0/0", "node0/1", "node1/0", "node1/1"]
    (tmp_path / "ranks.om").write_text(text)
    proc = subprocess.run([need("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "ranks.om"),
                           str(tmp_path / "data")], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr

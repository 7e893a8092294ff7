"""`runwatch train` end to end as a subprocess: bad input, Ctrl-C, drills, fast-forward."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from runwatch.exporter.server import start
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.sealed import unseal
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.integration

INCIDENT_NAMES = ("lr_spike", "corrupt_shard", "repeated_batch", "slow_node")


def runwatch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def assert_usage_error(res: subprocess.CompletedProcess, flag: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("runwatch train: ") and flag in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--incident", "meteor"], "--incident"),
        (["--steps", "300"], "--steps"),
        (["--steps", "100"], "--steps"),
        (["--lr", "0"], "--lr"),
        (["--lr", "-0.1"], "--lr"),
        (["--seed", "x"], "--seed"),
        (["--fast-forward", "-1"], "--fast-forward"),
        (["--incident", "lr_spike:0"], "--incident"),
        (["--incident", "lr_spike:1.5"], "--incident"),
        (["--incident", "lr_spike:nan"], "--incident"),
        (["--incident", "lr_spike:big"], "--incident"),
        (["--incident", "none:0.5"], "--incident"),
        (["--incident", "meteor:0.5"], "--incident"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, args, flag):
    res = runwatch("train", "--offline", "--out", "run.om", *args, cwd=tmp_path)
    assert_usage_error(res, flag)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_out_leaves_nothing(tmp_path):
    res = runwatch("train", "--offline", "--out", "missing-dir/run.om", cwd=tmp_path)
    assert_usage_error(res, "--out")
    assert list(tmp_path.iterdir()) == []


def test_out_into_a_file_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    res = runwatch("train", "--offline", "--out", "file/run.om", cwd=tmp_path)
    assert_usage_error(res, "--out")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_port_in_use(tmp_path):
    srv = start(CollectorRegistry(), free_port())
    try:
        res = runwatch("train", "--port", str(srv.server_address[1]), cwd=tmp_path)
    finally:
        srv.shutdown()
    assert_usage_error(res, "--port")
    assert "already in use" in res.stderr


def test_offline_writes_the_file_and_nothing_else(tmp_path):
    res = runwatch("train", "--offline", "--out", "run.om", "--incident", "slow_node", "--seed", "3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.om"]
    text = (tmp_path / "run.om").read_text()
    assert text.endswith("# EOF\n") and 'run_id="slow_node-3"' in text


def start_live(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "train", "--port", str(port), "--run-dir", "run", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if "runwatch_train_step{" in requests.get(url, timeout=1).text:
                return proc, url
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"trainer never served a step: {proc.stderr.read()}")


def served_step(url: str) -> float:
    """The step the trainer serves (its runwatch_train_step), -1 before it serves one."""
    text = requests.get(url, timeout=5).text
    families = text_string_to_metric_families(text)
    return max((s.value for f in families for s in f.samples if s.name == "runwatch_train_step"), default=-1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_cleanly_with_run_json_complete(tmp_path, sig):
    proc, url = start_live(tmp_path, "--incident", "slow_node", "--fast-forward", "100")
    # a live step after the first it served: the run is in its paced loop, where an interrupt
    # must end it cleanly (one step a lab second, before the slow node's onset)
    first = served_step(url)
    wait_for(lambda: served_step(url) > first, 5 * TrainConfig().step_seconds, "a live step")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "interrupted"
    assert record["last_step"] >= 100
    assert record["config"]["incident"] == "slow_node"
    assert record["ended_at"]
    # no temp files left; the fast-forward saved its checkpoints (a restart goes back to them)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints", "run.json"]
    assert [p.name for p in sorted((tmp_path / "run" / "checkpoints").iterdir())][:2] == [
        "checkpoint-000049.npz",
        "checkpoint-000099.npz",
    ]


def test_live_run_fast_forwards_and_logs(tmp_path):
    proc, url = start_live(tmp_path, "--fast-forward", "598", "--steps", "600", "--onset", "10", "--hold", "0")
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "fast-forwarded to step 598" in out
    assert re.search(r"run none-0-\d{6}: completed", out), out  # a live run's id is stamped
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (record["status"], record["last_step"]) == ("completed", 599)


def test_drill_hides_the_incident_and_seals_the_answer(tmp_path):
    proc, url = start_live(tmp_path, "--incident", "random", "--drill-seed", "11", "--fast-forward", "50")
    try:
        text = requests.get(url, timeout=2).text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)
    for name in INCIDENT_NAMES:
        assert name not in text
    assert 'incident="hidden"' in text
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["config"]["incident"] == "hidden" and record["config"]["onset"] == -1
    answer = unseal(tmp_path / "run" / "answer.sealed")
    assert answer["incident"] in ("none", *INCIDENT_NAMES)
    assert 240 <= answer["onset"] <= 360
    assert answer["incident"] not in (tmp_path / "run" / "answer.sealed").read_text()
    assert os.stat(tmp_path / "run" / "answer.sealed").st_mode & 0o077 == 0


def _loss_at(metrics: str) -> tuple[int, float]:
    """The step and loss a scrape of the trainer shows."""
    step = int(float(re.search(r"^runwatch_train_step\{[^}]*\} (\S+)$", metrics, re.M)[1]))
    return step, float(re.search(r"^runwatch_train_loss\{[^}]*\} (\S+)$", metrics, re.M)[1])


def _replayed_loss(seed: int, step: int, incident: str = "none") -> float:
    """What an attacker computes offline: the run of this seed, replayed bit for bit."""
    from runwatch.trainer.config import TrainConfig
    from runwatch.trainer.run import Trainer

    trainer = Trainer(TrainConfig(incident=incident, seed=seed))
    return next(rec.loss for rec in iter(trainer.step, None) if rec.step == step)


def test_a_drill_cannot_be_solved_by_replaying_its_seed(tmp_path):
    """Issue 28, item 1: every drill trained seed 0, shown in run_info, argv and run.json, so an
    offline replay of seed 0's healthy run named the onset as the first step whose loss differs.
    Now the seed is drawn in secret with the answer: nothing the learner reads names it, and the
    seed-0 replay differs from the drill's very first steps, so it names nothing."""
    proc, url = start_live(tmp_path, "--incident", "random", "--drill-seed", "11", "--fast-forward", "50")
    try:
        text = requests.get(url, timeout=2).text
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    answer = unseal(tmp_path / "run" / "answer.sealed")
    seed = answer["seed"]
    assert 'seed="hidden"' in text and f'seed="{seed}"' not in text and 'seed="0"' not in text
    assert "--seed" not in proc.args
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["config"]["seed"] == -1 and str(seed) not in json.dumps(record)
    assert str(seed) not in out + err  # nor in the trainer's log
    step, loss = _loss_at(text)
    assert step < answer["onset"]  # still before the incident: the healthy prefix of its seed
    assert loss != _replayed_loss(0, step)  # the replay of seed 0 is another run altogether
    assert loss == _replayed_loss(seed, step)  # the drill trains the sealed seed, bit for bit


def test_a_drill_refuses_a_seed_in_argv(tmp_path):
    res = runwatch("train", "--incident", "random", "--seed", "3", "--offline", "--out", "run.om", cwd=tmp_path)
    assert_usage_error(res, "--seed")
    assert list(tmp_path.iterdir()) == []

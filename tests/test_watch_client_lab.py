"""`runwatch up --watch`: the lab without its trainer, scraping a job of the user's instead.

No torch here: the job is this test process, serving runwatch.watch's registry (the torch tier,
tests/test_watch_client_torch.py, runs the real thing). The refusals run `runwatch up` itself.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from runwatch.prom.server import free_port, instant
from runwatch.watch import Watch
from tests.conftest import runwatch, wait_for


def test_up_watch_scrapes_the_users_job_and_starts_no_trainer(lab_factory):
    w = Watch("mine-1", registry=CollectorRegistry(), env={})
    port = w.serve(free_port())
    w.step(41, 0.5, tokens=64, gradient_norm=1.0, learning_rate=0.1)
    lab = lab_factory("--watch", f"127.0.0.1:{port}").wait()
    assert set(lab.records()) == {"pager", "alertmanager", "prometheus", "console"}  # no trainer of its own
    assert json.loads((lab.targets / "trainer.json").read_text()) == [{"targets": [f"127.0.0.1:{port}"]}]
    record = json.loads((lab.state / "lab.json").read_text())
    assert record["run_id"] is None and record["watch"] == [f"127.0.0.1:{port}"]
    step = 'runwatch_train_step{job="trainer",run_id="mine-1"}'
    found = wait_for(lambda: instant(lab.url("prometheus"), step), 30, "the user's job to be scraped")
    assert found[0]["value"][1] == "41"
    status = runwatch("status", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert status.returncode == 0 and status.stdout.startswith(f"watching 127.0.0.1:{port}: "), status.stdout
    assert status.stdout.count(" ready ") == 4
    ack = runwatch("ack", "TrainingLossJump", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert ack.returncode == 2 and "--run: the lab in" in ack.stderr and "name its run" in ack.stderr, ack.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watch", "127.0.0.1:8000", "--incident", "lr_spike"], "the lab's own trainer does not run, so --incident"),
        (["--watch", "127.0.0.1:8000", "--control"], "so --control means nothing"),
        (["--watch", "127.0.0.1:0"], "argument --watch: '127.0.0.1:0' is not HOST:PORT"),
        (["--watch", "missing-file"], "argument --watch: missing-file: neither HOST:PORT[,...] nor a readable file"),
    ],
)  # fmt: skip
def test_up_watch_refuses_bad_input_in_one_line_and_starts_nothing(tmp_path, args, message):
    state = tmp_path / "state"
    res = runwatch("up", "--state-dir", str(state), "--ports", "free", "--detach", *args, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (state / "pids").exists() and not (state / "lab.json").exists()

"""Bad input on the command line and in the state directory: one line naming the flag or the
file, exit 2 (or 1 when a tool or server failed), nothing started and nothing half-written.

None of these starts a lab; each case was a traceback, a hang or a silent wrong answer before.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import numpy as np
import pytest

from runwatch.drill.record import scoreboard_line
from runwatch.prom.tools import binary
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import Trainer
from tests.conftest import runwatch


def one_line(res, code: int, *words: str) -> None:
    assert res.returncode == code, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    for word in words:
        assert word in res.stderr, res.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, flag",
    [(["train", "--offline", "--out", "x.om", "--steps", "99999999999999999999"], "--steps"),
     (["train", "--offline", "--out", "x.om", "--steps", "100000000"], "--steps"),
     (["train", "--offline", "--out", "x.om", "--seed", "-1"], "--seed"),
     (["train", "--offline", "--out", "x.om", "--lr", "inf"], "--lr"),
     (["train", "--offline", "--out", "x.om", "--lr", "nan"], "--lr"),
     (["train", "--port", "70000"], "--port"),
     (["train", "--hold", "-1"], "--hold"),
     (["backtest", "--seeds", "0-99999999999"], "--seeds"),
     (["backtest", "--seeds", "5000000000"], "--seeds"),
     (["backtest", "--workers", "0"], "--workers"),
     (["up", "--seed", "-1", "--state-dir", "state"], "--seed"),
     (["up", "--onset", "700", "--state-dir", "state"], "--onset"),
     (["up", "--ranks", "3", "--state-dir", "state"], "--ranks"),
     (["up", "--ranks", "32", "--state-dir", "state"], "--ranks"),
     (["drill", "--ranks", "17", "--state-dir", "state"], "--ranks"),
     (["diagnose", "hang", "--rank", "-1", "--state-dir", "state"], "--rank"),
     (["up", "--incident", "straggler", "--state-dir", "state"], "--incident"),
     (["up", "--incident", "lr_spike:3", "--state-dir", "state"], "--incident"),
     (["up", "--incident", "hang:0.5", "--state-dir", "state"], "--incident"),
     (["train", "--rank-port-base", "70000"], "--rank-port-base"),
     (["train", "--step-seconds", "0", "--offline", "--out", "x.om"], "--step-seconds"),
     (["plate", "--since", "1e300"], "--since")],
)  # fmt: skip
def test_every_numeric_flag_has_a_range(tmp_path, args, flag):
    res = runwatch(*args, cwd=tmp_path, timeout=60)
    one_line(res, 2, flag)
    assert list(tmp_path.iterdir()) == []  # nothing written, no state directory, no run


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    trainer = Trainer(TrainConfig())
    for _ in range(3):
        trainer.step()
    return trainer.save_checkpoint(tmp_path_factory.mktemp("checkpoints"))


def _empty(path: Path, good: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path, good: Path) -> None:
    path.write_bytes(good.read_bytes()[:500])


def _wrong_shape(path: Path, good: Path) -> None:
    with np.load(good) as saved:
        arrays = {key: saved[key] for key in saved.files}
    np.savez(path, **{**arrays, "w": np.zeros((3, 3))})


@pytest.mark.integration
@pytest.mark.parametrize("weight", [np.nan, 1e308], ids=["nan", "finite but overflowing"])
def test_resume_of_a_checkpoint_with_nan_weights_is_refused(tmp_path, checkpoint, weight):
    """Issue 28, item 11: it resumed and trained "loss nan" silently; issue 40, P10: so did a
    finite w[0,0]=1e308, whose logits overflow."""
    with np.load(checkpoint) as saved:
        arrays = {key: saved[key] for key in saved.files}
    w = arrays["w"].copy()
    w[0, 0] = weight
    np.savez(tmp_path / "nan.npz", **{**arrays, "w": w})
    res = runwatch("train", "--resume", str(tmp_path / "nan.npz"), "--port", "0", "--run-dir", "run", cwd=tmp_path,
                   timeout=60)  # fmt: skip
    one_line(res, 2, "--resume", "not finite")
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.parametrize("damage", [_empty, _truncated, _wrong_shape])
def test_resume_of_a_damaged_checkpoint_is_refused_before_anything_starts(tmp_path, checkpoint, damage):
    bad = tmp_path / "bad.npz"
    damage(bad, checkpoint)
    res = runwatch("train", "--resume", str(bad), "--port", "0", "--run-dir", "run", cwd=tmp_path, timeout=60)
    one_line(res, 2, "--resume", "not a runwatch checkpoint")
    assert not (tmp_path / "run").exists()  # no answer.sealed, no run.json saying "running"


@pytest.mark.integration
def test_a_failing_tool_in_the_backtest_is_one_line(tmp_path):
    """A Prometheus that dies at start (here a stand-in where the lab looks first, beside the
    real promtool) ends the backtest in one line."""
    fake = tmp_path / "bin" / "prometheus"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'prometheus, version 3.5.3 (a stand-in)'; exit 0; }\n"
        "echo 'err=\"opening storage failed\"' >&2\nexit 3\n"
    )
    fake.chmod(0o755)
    (fake.parent / "promtool").symlink_to(binary("promtool"))
    env = {"RUNWATCH_BIN": str(fake.parent)}
    res = runwatch("backtest", "--seeds", "0", "--incidents", "none", cwd=tmp_path, timeout=120, env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    last = res.stderr.strip().splitlines()[-1]  # after the progress lines
    assert last == 'runwatch backtest: prometheus did not become ready: err="opening storage failed"'


# --- the state directory ---


@pytest.mark.integration
def test_up_refuses_while_another_up_or_down_holds_the_lab(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    with open(state / "lab.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a second `runwatch up` starting in this state dir does
        res = runwatch("up", "--state-dir", str(state), "--detach", cwd=tmp_path, timeout=60)
    one_line(res, 2, "another `runwatch up` or `down`")
    assert sorted(p.name for p in state.iterdir()) == ["lab.lock"]  # the winner's files untouched


@pytest.mark.integration
def test_a_state_dir_that_cannot_be_made_names_the_flag(tmp_path):
    (tmp_path / "file").write_text("")
    res = runwatch("up", "--state-dir", str(tmp_path / "file" / "state"), "--detach", cwd=tmp_path, timeout=60)
    one_line(res, 2, "--state-dir")


@pytest.mark.integration
def test_a_damaged_pid_file_is_reported_and_removed_never_trusted(tmp_path):
    pids = tmp_path / "state" / "pids"
    pids.mkdir(parents=True)
    (pids / "trainer.json").write_text('{"pid": 12')  # truncated by a crash
    (pids / "pager.json").write_text('["a", "list"]')  # the wrong type
    # issue 28: an object of the wrong shape (KeyError: 'pid', and a format error)
    (pids / "console.json").write_text('{"argv": ["x"], "url": "u"}')
    (pids / "alertmanager.json").write_text('{"pid": "12", "argv": ["x"], "url": "u"}')
    res = runwatch("status", "--state-dir", str(tmp_path / "state"), cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and res.stdout.count("DAMAGED") == 4 and "Traceback" not in res.stderr
    res = runwatch("down", "--state-dir", str(tmp_path / "state"), cwd=tmp_path, timeout=60)
    assert res.returncode == 0 and "stop it by hand" in res.stderr and "Traceback" not in res.stderr
    assert list(pids.iterdir()) == []


@pytest.mark.integration
@pytest.mark.parametrize(
    "name, text, command",
    [("lab.json", '{"run_id": ', ["reload"]), ("lab.json", "[]", ["reload"]),
     ("drill.json", '{"run_id": "x"', ["diagnose", "none"]), ("drill.json", '"text"', ["ack", "HeldOutGap"]),
     ("drill.json", '{"run_id": "x", "acks": []}', ["diagnose", "none"]),
     ("drill.json", '{"run_id": ', ["drill"]), ("drill.json", "[" * 100_000, ["drill"]),
     ("lab.json", "[" * 100_000, ["reload"])],
)  # fmt: skip
def test_a_damaged_state_file_is_one_line_naming_it(tmp_path, name, text, command):
    state = tmp_path / "state"
    state.mkdir()
    (state / name).write_text(text)
    res = runwatch(*command, "--state-dir", str(state), cwd=tmp_path, timeout=60)
    one_line(res, 2, name if name != "drill.json" or "acks" not in text else "sealed answer")
    assert (state / name).read_text() == text  # left as it was, for the learner to look at


def test_a_torn_scoreboard_line_is_skipped(tmp_path):
    board = tmp_path / "scoreboard.jsonl"
    rows = [{"run_id": "a", "correct": True}, {"run_id": "b", "correct": False}]
    nested = "[" * 100_000  # issue 28: it failed every diagnose, naming no file
    board.write_text(json.dumps(rows[0]) + '\n{"run_id": "c", "corr\n' + nested + "\n" + json.dumps(rows[1]) + "\n")
    assert scoreboard_line(board) == "scoreboard: 1/2 drills diagnosed correctly"


def test_a_deeply_nested_page_log_line_is_skipped_and_the_pager_starts(tmp_path):
    """Issue 28, item 8: one such line gave `runwatch pager` a RecursionError and kept
    `pager-serve` (and so `up`) from starting."""
    import io

    from runwatch.oncall.page_log import PageLog, read_pages

    log = tmp_path / "pages.jsonl"
    page = {"alert": "A", "fingerprint": "f", "starts_at": "s", "status": "firing", "received_at": "r"}
    log.write_text(json.dumps(page) + "\n" + "[" * 100_000 + "\n")
    said = io.StringIO()
    assert read_pages(log, stderr=said) == [page] and "line 2" in said.getvalue()
    assert PageLog(log).seen == {("f", "s", "firing")}


@pytest.mark.integration
def test_a_postmortem_over_a_damaged_run_json_is_written_without_the_run_end(tmp_path):
    """Issue 28, item 8: a damaged run.json gave `postmortem` a JSONDecodeError, AttributeError or
    ValueError; it is the trainer's record, so the timeline goes without its end and says why."""
    state = tmp_path / "state"
    (state / "runs" / "drill-1").mkdir(parents=True)
    record = {"run_id": "drill-1", "started_at": 1.0e9, "acks": [],
              "diagnosis": {"at": 1.0e9 + 60, "incident": "none"},
              "grade": {"diagnosed": "none", "correct": True, "incident": "none", "onset": None, "first_page": None,
                        "onset_to_first_page_s": None, "first_page_to_ack_s": None,
                        "first_page_to_diagnosis_s": None}}  # fmt: skip
    (state / "drill.json").write_text(json.dumps(record))
    for damaged in ('{"ended_at": ', '["a list"]', '{"ended_at": "not a time"}'):
        (state / "runs" / "drill-1" / "run.json").write_text(damaged)
        res = runwatch("postmortem", "--out", str(tmp_path / "pm.md"), "--state-dir", str(state), cwd=tmp_path,
                       timeout=120)  # fmt: skip
        assert "Traceback" not in res.stderr, res.stderr
        assert "run.json" in res.stderr or "not a time" in res.stderr, res.stderr
        assert (tmp_path / "pm.md").exists() and "Run ended" not in (tmp_path / "pm.md").read_text()


@pytest.mark.integration
def test_status_says_when_the_run_ended(tmp_path):
    """After the run completes its trainer keeps serving (ready), so status says the run ended."""
    state = tmp_path / "state"
    (state / "pids").mkdir(parents=True)
    (state / "pids" / "trainer.json").write_text(json.dumps({"pid": 2**22 + 1, "argv": ["gone"], "url": "u"}))
    (state / "lab.json").write_text(json.dumps({"run_id": "none-0-120000", "started_at": 0}))
    (state / "runs" / "none-0-120000").mkdir(parents=True)
    run = {"run_id": "none-0-120000", "status": "completed", "ended_at": "2026-11-30T12:10:00.250+00:00",
           "last_step": 599}  # fmt: skip
    (state / "runs" / "none-0-120000" / "run.json").write_text(json.dumps(run))
    res = runwatch("status", "--state-dir", str(state), cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "EXITED" in res.stdout, res.stdout + res.stderr
    assert res.stdout.startswith("run none-0-120000: completed at 12:10:00 UTC, last step 599\n")

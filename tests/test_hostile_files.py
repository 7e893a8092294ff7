"""Hostile files where the lab reads configuration and state (issue 40, item 3): a rule file or a
NOTES.txt that is a FIFO, a device or over its cap, YAML with an alias, a lab.json truncated,
nested or without its root, a `--watch` file that is /dev/zero or a FIFO. Each is one line naming
the file, nothing is copied or half-written, and the component that read it keeps serving.

Every reader goes through runwatch.core.bounded. A FIFO or an over-cap file stands in for
/dev/zero where the test also runs against the code before the fix (a reader without bounds
would fill memory or disk, not fail)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import requests

from runwatch.core.bounded import MAX_RULE_FILE_BYTES
from runwatch.core.paths import REPO
from runwatch.prom.server import free_port, wait_ready
from tests.conftest import runwatch
from tests.test_rules_console import token

pytestmark = pytest.mark.integration


def hostile(path, kind: str) -> None:
    """Put a hostile file at path."""
    path.unlink(missing_ok=True)
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "over the cap":
        path.write_bytes(b"#" * (MAX_RULE_FILE_BYTES + 1))  # comments: YAML promtool would take
    elif kind == "an alias":
        path.write_text("groups: &g []\nagain: *g\n")


KINDS = ["a FIFO", "/dev/zero", "over the cap"]


def configuration(tmp_path):
    for d in ("prometheus", "alertmanager"):
        shutil.copytree(REPO / d, tmp_path / d)
    return tmp_path


@pytest.mark.parametrize("kind", KINDS)
def test_check_refuses_a_rule_file_promtool_should_not_read(tmp_path, kind):
    """N7: `zz.yml` -> /dev/zero took promtool to 3.3 GB in 6 s under `runwatch check --root`;
    reload and Apply run the same checks (runwatch.prom.checks.run_all)."""
    root = configuration(tmp_path)
    hostile(root / "prometheus" / "rules" / "zz.yml", kind)
    res = runwatch("check", "--root", str(root), cwd=tmp_path, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    named = [
        line for line in res.stdout.splitlines() if "zz.yml" in line and ("regular file" in line or "bytes" in line)
    ]
    assert named, res.stdout


@pytest.mark.parametrize("kind", ["a FIFO", "/dev/zero"])
def test_up_watch_of_a_file_that_is_no_file_is_one_line(tmp_path, kind):
    """N24: `up --watch /dev/zero` gave a MemoryError traceback, and a FIFO blocked."""
    target = tmp_path / "targets"
    hostile(target, kind)
    res = runwatch("up", "--watch", str(target), "--state-dir", str(tmp_path / "state"), cwd=tmp_path, timeout=30)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "targets: a file of addresses is not a regular file" in res.stderr.strip().splitlines()[-1], res.stderr


@pytest.fixture
def console(tmp_path):
    """The console over a lab.json whose root is this test's copy of the configuration, with a
    TMPDIR of its own (where Backtest and Apply copy the configuration)."""
    root, state, tmpdir = configuration(tmp_path / "root"), tmp_path / "state", tmp_path / "tmp"
    state.mkdir()
    tmpdir.mkdir()
    (state / "lab.json").write_text(json.dumps({"run_id": "r1", "root": str(root), "urls": {}}))
    nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere,
         "--alertmanager", nowhere, "--pager", nowhere, "--state-dir", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmpdir)},
    )  # fmt: skip
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc), proc.stderr.read()
        yield f"http://127.0.0.1:{port}", root, state, tmpdir
    finally:
        proc.terminate()
        proc.wait(10)


def one_line_and_serving(resp: requests.Response, base: str, names: str) -> None:
    assert resp.status_code == 422 and names in resp.text, (resp.status_code, resp.text[-500:])
    assert len(resp.text.strip().splitlines()) == 1, resp.text
    assert requests.get(f"{base}/-/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("kind", [*KINDS, "an alias"])
def test_the_rules_page_over_a_hostile_rule_file_is_one_line(console, kind):
    """N4: `rules/zz.yml` -> /dev/zero read until MemoryError; N5: a 708-byte alias bomb took
    GET /rules to MemoryError in 9.9 s (a single alias stands for it: the lab's YAML has none)."""
    base, root, _, _ = console
    hostile(root / "prometheus" / "rules" / "zz.yml", kind)
    one_line_and_serving(requests.get(f"{base}/rules", timeout=30), base, "zz.yml")


@pytest.mark.parametrize(
    "damage",
    ['{"run_id": "r1", "ro', '{"run_id": "r1"}', "[" * 100_000, "[]"],
    ids=["truncated", "no root", "nested", "a list"],
)
def test_the_rules_page_over_a_damaged_lab_json_is_one_line(console, damage):
    """N6: a truncated lab.json, or one without "root", made GET /rules a 500."""
    base, _, state, _ = console
    (state / "lab.json").write_text(damage)
    one_line_and_serving(requests.get(f"{base}/rules", timeout=30), base, "lab.json")


@pytest.mark.parametrize(
    "action, where", [("backtest", "prometheus/rules/NOTES.txt"), ("apply", "alertmanager/NOTES.txt")]
)
@pytest.mark.parametrize("kind", ["a FIFO", "/dev/zero"])
def test_backtest_and_apply_copy_no_hostile_file(console, action, where, kind):
    """N3: `rules/NOTES.txt` -> /dev/zero: Backtest and Apply copied it until TMPDIR was full."""
    base, root, _, tmpdir = console
    form = {"token": token(base), "expr": "run:runwatch_train_heldout_to_train_loss:ratio20s > 1.9", "for": "10s",
            "seeds": "100-101"}  # fmt: skip
    hostile(root / where, kind)
    resp = requests.post(f"{base}/rules/HeldOutGap/{action}", data=form, timeout=60)
    one_line_and_serving(resp, base, "NOTES.txt")
    assert not [*tmpdir.glob("runwatch-console-backtest-*"), *tmpdir.glob("runwatch-console-apply-*")]  # no copy left
    assert (root / "prometheus" / "rules" / "alerts.yml").read_text() == (
        REPO / "prometheus" / "rules" / "alerts.yml"
    ).read_text()


@pytest.mark.parametrize("damage", ["[" * 100_000, "a FIFO"], ids=["nested", "a FIFO"])
def test_the_console_over_a_damaged_drill_json_serves_its_page(console, damage):
    """B9: a nested drill.json made GET / a 500 (RecursionError): the console reads no drill."""
    base, _, state, _ = console
    if damage == "a FIFO":
        hostile(state / "drill.json", damage)
    else:
        (state / "drill.json").write_text(damage)
    resp = requests.get(f"{base}/", timeout=30)
    assert resp.status_code == 200 and "Traceback" not in resp.text, resp.text[-500:]


def a_page(received_at: object = "2026-01-01T00:00:00.000Z", fingerprint: object = "f00d") -> str:
    from runwatch.oncall.records import page_record

    alert = {"status": "firing", "labels": {"alertname": "HeldOutGap", "run_id": "r1"}, "annotations": {},
             "fingerprint": "f00d", "startsAt": "2026-01-01T00:00:00Z"}  # fmt: skip
    return json.dumps({**page_record(alert, "x"), "received_at": received_at, "fingerprint": fingerprint}) + "\n"


def test_runwatch_pager_over_a_deeply_nested_line_shows_the_other_pages(tmp_path):
    """P1: a line of 200k `[` made `runwatch pager --log F` a RecursionError traceback."""
    log = tmp_path / "pages.jsonl"
    log.write_text(a_page() + "[" * 200_000 + "\n")
    res = runwatch("pager", "--log", str(log), cwd=tmp_path, timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "HeldOutGap" in res.stdout


@pytest.mark.parametrize(
    "line", [a_page(received_at=None), a_page(fingerprint=["f00d"]), a_page(fingerprint={"f": 1})],
    ids=["received_at null", "a list for a fingerprint", "a mapping for a fingerprint"],
)  # fmt: skip
def test_pager_serve_starts_over_a_hand_edited_last_page(tmp_path, line):
    """P1: a last line with `"received_at": null`, or a fingerprint given as a list, kept
    pager-serve from starting (TypeError). It starts, and the log keeps the line."""
    log = tmp_path / "pages.jsonl"
    log.write_text(a_page() + line)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "pager-serve", "--port", str(port), "--log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc), proc.stderr.read()[-2000:]
    finally:
        proc.terminate()
        proc.wait(10)
    assert log.read_text() == a_page() + line

"""The Rules page is one writer at a time (issue 40, N1, N2, N8, N9), over real HTTP: `runwatch
console` over a copy of the configuration of its own, its commands (`runwatch check`,
`runwatch backtest`) followed as its own child processes, never searched for on the machine.

- Two Apply clicks at once both end: the second is told another Apply is running, and the
  console answers meanwhile (a threading.Lock held across an await once hung it for good).
- A save made to alerts.yml while an Apply's checks run is kept, and the Apply is refused.
- One backtest at a time; a kill -9 of a backtest leaves none of its Prometheus servers or
  workers running, and none of its temporary files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from runwatch.console.rules import BACKTEST_TIMEOUT_S, CHECK_TIMEOUT_S, GROUP_END_S
from runwatch.core.paths import REPO
from runwatch.prom.server import Process, free_port, wait_ready
from runwatch.prom.tools import binary
from tests.conftest import keep_unit_tests, wait_for

pytestmark = pytest.mark.integration

HELD_OUT = "run:runwatch_train_heldout_to_train_loss:ratio20s"
# The same condition in brackets: it passes every check, as an edit the learner means would.
SAME_RULE = f'({HELD_OUT})\n  > scalar(alert:runwatch_threshold:ratio{{alertname="HeldOutGap"}})'
GRACE_S = Process.__init__.__defaults__[1]  # what the backtest gives a child between SIGTERM and SIGKILL


def gated_promtool(tmp: Path) -> Path:
    """A folder of the lab's binaries (RUNWATCH_BIN) whose promtool waits, before each run but
    its --version, until the test creates GATE/open; GATE/reached says one is waiting. "While
    an Apply's checks run" is then a state the test holds as long as it needs, not a race
    against how long promtool takes."""
    folder, gate = tmp / "gated-bin", tmp / "gate"
    folder.mkdir()
    gate.mkdir()
    for name in ("prometheus", "alertmanager", "amtool"):
        (folder / name).symlink_to(binary(name))
    promtool = folder / "promtool"
    promtool.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] || {{ : > {gate}/reached; until [ -e {gate}/open ]; do sleep 0.05; done; }}\n'
        f'exec {binary("promtool")} "$@"\n'
    )
    promtool.chmod(0o755)
    return gate


class Console:
    """`runwatch console` of this test's own: its copy of the configuration, its TMPDIR, its cache.
    Its unit tests are the two-runs evaluation's and the baselines' (the checks' report is the
    subject here, not the shipped tests: test_edit_check). With `gated`, its promtool waits at a
    gate the test opens (gated_promtool)."""

    def __init__(self, tmp, prometheus: str | None = None, gated: bool = False):
        for d in ("prometheus", "alertmanager"):
            shutil.copytree(REPO / d, tmp / d)
        keep_unit_tests(tmp, two_runs=(), baselines=())
        self.root, self.state, self.tmp = tmp, tmp / "state", tmp / "tmpdir"
        self.state.mkdir()
        self.tmp.mkdir()
        (self.state / "lab.json").write_text(json.dumps({"run_id": "r1", "root": str(tmp), "urls": {}}))
        nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
        env = {**os.environ, "TMPDIR": str(self.tmp), "RUNWATCH_CACHE": str(tmp / "cache")}
        self.gate = gated_promtool(tmp) if gated else None
        if self.gate:
            env["RUNWATCH_BIN"] = str(tmp / "gated-bin")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", prometheus or nowhere,
             "--alertmanager", nowhere, "--pager", nowhere, "--state-dir", str(self.state)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{port}"
        assert wait_ready(f"{self.base}/-/ready", 30, self.proc), self.proc.stderr.read()
        self.alerts = tmp / "prometheus" / "rules" / "alerts.yml"
        self.token = re.search(r'name="token" value="([^"]+)"', self.get("/rules/HeldOutGap").text)[1]

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.base}{path}", timeout=10)

    def post(self, path: str, form: dict, timeout: float) -> requests.Response:
        return requests.post(f"{self.base}{path}", data={"token": self.token, **form}, timeout=timeout)

    def running(self, command: str) -> psutil.Process | None:
        """The console's child running `runwatch COMMAND`, if one runs."""
        for child in psutil.Process(self.proc.pid).children():
            try:
                if command in child.cmdline()[3:4]:
                    return child
            except psutil.Error:  # it ended meanwhile
                continue
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # the hang of N1 ignored SIGTERM
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def console(tmp_path):
    one = Console(tmp_path)
    yield one
    one.stop()


@pytest.fixture
def gated(tmp_path):
    one = Console(tmp_path, gated=True)
    yield one
    (one.gate / "open").touch()  # a failure above leaves no promtool waiting
    one.stop()


class Posted(threading.Thread):
    """A POST on its own thread: the test acts while the console works on it."""

    def __init__(self, console: Console, path: str, form: dict, timeout: float):
        super().__init__(daemon=True)
        self.args_, self.resp = (console, path, form, timeout), None
        self.start()

    def run(self) -> None:
        console, path, form, timeout = self.args_
        self.resp = console.post(path, form, timeout)

    def result(self, timeout: float) -> requests.Response:
        self.join(timeout)
        assert self.resp is not None, f"no answer in {timeout:g} s"
        return self.resp


APPLY = {"expr": SAME_RULE, "for": "10s", "threshold": "2"}


def test_a_second_apply_is_told_to_wait_and_both_end(gated):
    console = gated
    first = Posted(console, "/rules/HeldOutGap/apply", APPLY, 2 * CHECK_TIMEOUT_S)
    wait_for(lambda: (console.gate / "reached").exists(), CHECK_TIMEOUT_S, "the first Apply's promtool")
    second = console.post("/rules/HeldOutGap/apply", APPLY, CHECK_TIMEOUT_S)
    assert second.status_code == 409 and "another Apply is running" in second.text, second.text[-500:]
    assert console.get("/-/ready").status_code == 200 and console.running("check")  # answered while it checks
    (console.gate / "open").touch()
    assert first.result(2 * CHECK_TIMEOUT_S).status_code in (200, 400)
    assert console.get("/-/ready").status_code == 200


def test_a_save_on_disk_during_an_apply_is_kept_and_the_apply_refused(gated):
    console = gated
    shipped = console.alerts.read_text()
    first = Posted(console, "/rules/HeldOutGap/apply", APPLY, 2 * CHECK_TIMEOUT_S)
    wait_for(lambda: (console.gate / "reached").exists(), CHECK_TIMEOUT_S, "the Apply's promtool")
    saved = shipped + "# the learner's own note, saved while the Apply checks\n"
    console.alerts.write_text(saved)
    (console.gate / "open").touch()
    resp = first.result(2 * CHECK_TIMEOUT_S)
    assert resp.status_code == 400 and "changed on disk while you edited it" in resp.text, resp.text[-2000:]
    assert console.alerts.read_text() == saved
    assert not console.alerts.with_name("alerts.yml.previous").exists()


def family(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()[:1]) if proc.status() != psutil.STATUS_ZOMBIE else ""
    except psutil.Error:  # it ended meanwhile
        return ""


def gone(procs: list[psutil.Process]) -> bool:
    def ended(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(ended(p) for p in procs)


def loading(proc: psutil.Process) -> list[psutil.Process]:
    """The backtest's loader Prometheus and its training workers, once both run."""
    kids = family(proc)
    names = [command(k) for k in kids]
    return kids if any("prometheus" in n for n in names) and any("python" in n for n in names) else []


def test_one_backtest_at_a_time_and_a_killed_one_leaves_nothing_behind(console):
    first = Posted(console, "/rules/HeldOutGap/backtest", {**APPLY, "seeds": "100-199"}, BACKTEST_TIMEOUT_S)
    backtest = wait_for(lambda: console.running("backtest"), BACKTEST_TIMEOUT_S, "the console's runwatch backtest")
    children = wait_for(lambda: loading(backtest), BACKTEST_TIMEOUT_S, "its loader Prometheus and workers")
    try:
        second = console.post("/rules/HeldOutGap/backtest", {**APPLY, "seeds": "100-101"}, CHECK_TIMEOUT_S)
        assert second.status_code == 429 and "a backtest is running already" in second.text, second.text[-500:]
        backtest.send_signal(signal.SIGKILL)
        resp = first.result(BACKTEST_TIMEOUT_S)
        assert resp.status_code == 400
        assert gone(children), [command(c) for c in children if not gone([c])]
        left = sorted(p.name for p in console.tmp.iterdir() if not p.name.startswith("runwatch-console-plots-"))
        assert left == [], left
    finally:
        for child in children:  # a failure above leaves none of them running
            with contextlib.suppress(psutil.Error):
                child.kill()


def test_a_kill_9_of_a_backtest_ends_its_prometheus_and_its_workers(tmp_path):
    env = {**os.environ, "RUNWATCH_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "runwatch", "backtest", "--seeds", "100-199"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    children: list[psutil.Process] = []
    try:
        children = wait_for(lambda: loading(psutil.Process(proc.pid)), BACKTEST_TIMEOUT_S, "its loader and workers")
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + GRACE_S + GROUP_END_S
        while not gone(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(children), [command(c) for c in children if not gone([c])]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()

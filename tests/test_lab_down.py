"""Stopping a lab: a foreground `runwatch up` stops everything it started on SIGTERM, as on Ctrl-C,
and returns when `runwatch down` in another shell has stopped its lab.

Each test's lab is its own, on free ports (`--ports free`), its addresses in its lab.json.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest
import requests

from runwatch.lab.processes import Processes, started
from runwatch.lab.supervise import Lab
from runwatch.prom.server import port_is_free
from tests.conftest import runwatch, wait_for

UP = [sys.executable, "-m", "runwatch", "up", "--ports", "free"]


def foreground_up(state) -> tuple[subprocess.Popen, str]:
    """A foreground `runwatch up` that has started its lab, and what it printed while starting."""
    proc = subprocess.Popen(
        [*UP, "--state-dir", str(state)],
        cwd=state.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    printed = ""
    while "stop with `runwatch down" not in printed:  # its last line before the foreground loop
        line = proc.stdout.readline()  # a dead `up` ends the output: no endless wait
        assert line, printed
        printed += line
    # the command as printed stops this lab: it names the lab's state directory
    assert printed.endswith(f"stop with `runwatch down --state-dir {state}`\n"), printed
    lab = Lab(state)
    records = lab.records()
    assert len(records) == 5 and all(
        requests.get(r["ready_url"], timeout=5, auth=lab.auth(name)).ok for name, r in records.items()
    )  # auth: the lab's Alertmanager asks its password (runwatch.core.credentials)
    return proc, printed


@pytest.fixture
def state(lab_state):
    lab_state.parent.mkdir(parents=True, exist_ok=True)
    return lab_state


def test_foreground_up_returns_after_down_from_another_shell(state, tmp_path):
    proc, _ = foreground_up(state)
    try:
        res = runwatch("down", "--state-dir", str(state), cwd=tmp_path)
        assert res.returncode == 0 and "stopped: console, trainer, prometheus, alertmanager, pager" in res.stdout
        out, _ = proc.communicate(timeout=30)  # it looks once a second
    finally:
        proc.kill()
    assert proc.returncode == 0 and "the lab was stopped by `runwatch down`" in out, out
    assert "exited" not in out  # what down stopped is not reported as dying


def test_foreground_up_stops_every_component_on_sigterm(state):
    """`kill` of a foreground `runwatch up` stops what it started, as Ctrl-C does: no orphans."""
    proc, _ = foreground_up(state)
    try:
        records = Lab(state).records()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopping:" in out, out
    assert not any(Lab.alive(r) for r in records.values())
    assert Lab(state).records() == {}


def test_sigterm_while_starting_stops_what_had_started(state):
    """`kill` between two components' starts: the started ones are stopped, none is orphaned."""
    proc = subprocess.Popen(
        [*UP, "--state-dir", str(state), "--detach"],
        cwd=state.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().startswith(f"console: {Lab(state).url('console')}/")  # its URL first
        assert proc.stdout.readline().startswith("  trainer")  # printed once the trainer is ready
        records = Lab(state).records()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert records and not any(Lab.alive(r) for r in records.values())
    assert Lab(state).records() == {}
    # and nothing started after the trainer was left behind: every port of the lab is free again
    ports = Lab(state).ports
    assert [
        name for name in ("trainer", "pager", "alertmanager", "prometheus", "console") if not port_is_free(ports[name])
    ] == []


def test_down_ends_the_whole_job_of_a_launcher_killed_minus_9(state):
    """Issue 28, item 9: `up --ranks 4`, kill -9 of the launcher, and `down` said everything was
    stopped while mpiexec, its proxy and four ranks trained on as orphans, holding port 8000 for
    the next `up`. `down` ends the trainer's whole session: its every process, and the port."""
    import psutil

    res = runwatch("up", "--ports", "free", "--ranks", "4", "--detach", "--state-dir", str(state), cwd=state.parent,
                   timeout=180)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    launcher = Lab(state).records()["trainer"]

    def the_job() -> list:
        """Every process the launcher's job runs, once its four ranks do: they start after it answers."""
        job = psutil.Process(launcher["pid"]).children(recursive=True)  # each in a session of its own
        return job if len([p for p in job if "PMI_RANK" in _environ(p)]) == 4 else []

    job = wait_for(the_job, 60, "the launcher's four ranks")
    assert any("mpiexec" in " ".join(p.cmdline()) for p in job), [p.cmdline() for p in job]
    port = int(launcher["url"].rsplit(":", 1)[1].split("/")[0])
    psutil.Process(launcher["pid"]).kill()  # the launcher crashes; its job does not notice at once
    psutil.Process(launcher["pid"]).wait(10)
    res = runwatch("down", "--state-dir", str(state), cwd=state.parent)
    assert res.returncode == 0 and "trainer" in res.stdout, res.stdout + res.stderr
    assert not [p for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert port_is_free(port)


def _environ(proc) -> dict:
    import psutil

    try:
        return proc.environ()
    except psutil.Error:
        return {}


@pytest.mark.integration  # a real child process
def test_a_component_is_still_ours_after_the_clock_is_stepped(monkeypatch):
    """Linux derives a process's wall-clock start from the boot time, which moves when the clock
    is stepped (NTP, a virtual machine resumed): every component of a lab looked gone at once,
    `up` said its trainer exited during start and `reload` that Prometheus was not running. A
    step of an hour, made by moving the boot time psutil reads, leaves the lab's processes its
    own; a PID whose process started at another time is still not ours."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        record = {"pid": child.pid, "argv": ["sleep", "60"], **started(psutil.Process(child.pid))}
        assert Processes.alive(record)
        stepped = psutil.boot_time() + 3600
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: stepped)
        assert psutil.Process(child.pid).create_time() == record["create_time"] + 3600  # the step, as psutil sees it
        assert Processes.alive(record)
        reused = {**record, "create_time": record["create_time"] + 1, "since_boot": record["since_boot"] + 1}
        assert not Processes.alive(reused)
    finally:
        child.kill()
        child.wait()

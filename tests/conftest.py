"""Shared helpers: real binaries and free loopback ports."""

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runwatch.lab import Lab
from runwatch.paths import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(binary: str) -> str:
    """The binary's path; fail (not skip) when it is missing: CI installs it."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not on PATH: apt-get install prometheus prometheus-alertmanager")
    return path


def runwatch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """One native lab for the session, on the default ports, over a copy of the configuration:
    an incident run (corrupt_shard, fast-forwarded near its onset) and a healthy control."""
    root = tmp_path_factory.mktemp("checkout")
    for d in ("prometheus", "alertmanager", "runbooks"):
        shutil.copytree(REPO / d, root / d)
    state = root / "state"
    res = runwatch(
        "up", "--root", str(root), "--state-dir", str(state), "--incident", "corrupt_shard",
        "--fast-forward", "282", "--control", "--detach", cwd=root,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    lab = Lab(state, root)
    lab.cwd = root
    lab.run_id = json.loads((state / "lab.json").read_text())["run_id"]
    yield lab
    res = runwatch("down", "--state-dir", str(state), cwd=root)
    assert res.returncode == 0 and "prometheus" in res.stdout

"""`runwatch probe URL`, the containers' healthcheck: exit 0 on 200, 1 otherwise, 2 on bad usage."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from runwatch.exporter.server import start
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", "probe", *args], capture_output=True, text=True, timeout=30
    )


def test_ready_answers_0_and_says_nothing():
    srv = start(CollectorRegistry(), free_port())
    try:
        res = probe(f"http://127.0.0.1:{srv.server_address[1]}/-/ready")
        assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
        res = probe(f"http://127.0.0.1:{srv.server_address[1]}/nope")
        assert res.returncode == 1 and res.stderr.strip().endswith("is not ready: HTTP 404")
    finally:
        srv.shutdown()


def test_refused_is_one_line_and_exit_1():
    res = probe(f"http://127.0.0.1:{free_port()}/-/ready")
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "is not ready" in res.stderr


def test_bad_usage_is_exit_2():
    for args in ([], ["127.0.0.1:8000"], ["http://127.0.0.1:8000", "soon"], ["a", "b", "c"]):
        res = probe(*args)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (args, res.stderr)

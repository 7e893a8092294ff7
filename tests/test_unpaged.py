"""A page lost while the pager was down leaves a trace: `runwatch pager` names each alert that
Prometheus fired (its ALERTS series) but that never reached the page log.

A real Prometheus, backfilled by promtool with the ALERTS samples a lab would have written: an
alert that fired and resolved while the pager was down (lost), one that paged, one too recent
to judge, and the Watchdog, which never pages.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest

from runwatch.oncall.pager import UNPAGED_AFTER_S, Unpaged
from runwatch.oncall.records import rfc3339_ms
from runwatch.prom.server import Process, free_port, prometheus_argv
from tests.conftest import need

NOW = float(int(time.time()))


def alerts_openmetrics() -> str:
    def series(alert: str, run_id: str, severity: str, start: float, seconds: int) -> list[str]:
        labels = f'alertname="{alert}",alertstate="firing",run_id="{run_id}",severity="{severity}"'
        return [f"ALERTS{{{labels}}} 1 {start + i:.0f}" for i in range(seconds)]

    lines = ["# TYPE ALERTS gauge"]
    lines += series("GradientNormJump", "run-1", "page", NOW - 600, 5)  # fired and resolved: lost
    lines += series("TrainingLossJump", "run-1", "page", NOW - 600, 30)  # paged
    lines += series("HeldOutGap", "run-1", "page", NOW - UNPAGED_AFTER_S / 2, 20)  # on its way
    lines += series("Watchdog", "", "none", NOW - 600, 600)  # never a page, by design
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unpaged")
    (tmp / "alerts.om").write_text(alerts_openmetrics())
    subprocess.run(
        [need("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(tmp / "alerts.om"), str(tmp / "data")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (tmp / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    argv = prometheus_argv(need("prometheus"), tmp / "prometheus.yml", tmp / "data", port, "--query.lookback-delta=3s")
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp / "prometheus.log"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "pages.jsonl"
    page = {"alert": "TrainingLossJump", "run_id": "run-1", "status": "firing", "received_at": rfc3339_ms(NOW - 599)}
    path.write_text(json.dumps(page) + "\n")
    return path


@pytest.mark.integration
def test_an_alert_that_fired_but_never_paged_is_named_once(prometheus, log):
    unpaged = Unpaged(log, prometheus, clock=lambda: NOW)
    out, err = io.StringIO(), io.StringIO()
    unpaged.check(out, err)
    unpaged.check(out, err)  # --follow asks again every 10 s: each alert is named once
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and err.getvalue() == "", (lines, err.getvalue())
    assert "UNPAGED   GradientNormJump" in lines[0] and "run=run-1" in lines[0]
    assert f"fired in Prometheus at {rfc3339_ms(NOW - 600)[11:19]}" in lines[0]


@pytest.mark.integration
def test_the_pager_command_prints_the_trace_after_the_pages(prometheus, log):
    res = subprocess.run(
        [sys.executable, "-m", "runwatch", "pager", "--log", str(log), "--prometheus", prometheus],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "FIRING    TrainingLossJump" in lines[0] and "UNPAGED   GradientNormJump" in lines[1]
    # HeldOutGap may be old enough by now to count; the paged alert and the Watchdog never do
    assert not any("UNPAGED   TrainingLossJump" in line or "Watchdog" in line for line in lines)


def test_a_prometheus_that_cannot_be_asked_is_said_once(log):
    unpaged = Unpaged(log, f"http://127.0.0.1:{free_port()}")
    out, err = io.StringIO(), io.StringIO()
    unpaged.check(out, err)
    unpaged.check(out, err)
    assert out.getvalue() == "" and err.getvalue().count("\n") == 1 and "--prometheus" in err.getvalue()

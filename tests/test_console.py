"""The console's server over real HTTP, without a lab: `runwatch console` reading a real pager,
with Prometheus and Alertmanager not answering. What it shows of hostile pages, what it refuses,
and how it fails. The browser tests on a live lab are in test_console_e2e.py."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading

import pytest
import requests
from prometheus_client import CollectorRegistry

from runwatch.oncall.follow import DEFAULT_RUNBOOKS
from runwatch.oncall.pager import make_server
from runwatch.prom.server import free_port, wait_ready
from tests.conftest import runwatch

pytestmark = pytest.mark.integration  # a console and a pager of its own, over HTTP

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """A pager holding one hostile page, and the console reading it; Prometheus and
    Alertmanager are addresses where nothing listens."""
    tmp = tmp_path_factory.mktemp("console")
    page = {"received_at": "2026-01-01T00:00:01.000Z", "alert": "HtmlPage", "status": "firing", "run_id": "r1",
            "step": "300", "summary": HOSTILE, "description": HOSTILE, "severity": "page",
            "rule": {"expr": "x > 3 <b>", "for": "10s"}}  # fmt: skip
    (tmp / "pages.jsonl").write_text(json.dumps(page) + "\n")
    pager = make_server("127.0.0.1", 0, tmp / "pages.jsonl", registry=CollectorRegistry(), runbooks=DEFAULT_RUNBOOKS)
    threading.Thread(target=pager.serve_forever, daemon=True).start()
    nowhere = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere,
         "--alertmanager", nowhere, "--pager", f"http://127.0.0.1:{pager.server_address[1]}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc), proc.stderr.read()
        yield f"http://127.0.0.1:{port}", nowhere
    finally:
        proc.terminate()
        proc.wait(10)
        pager.shutdown()


def test_a_hostile_page_is_shown_as_text(console):
    base, _ = console
    resp = requests.get(f"{base}/pages", params={"run": "r1"}, timeout=10)
    assert resp.status_code == 200
    assert "<script>" not in resp.text and "<img" not in resp.text and "<b>" not in resp.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in resp.text
    assert "x &gt; 3 &lt;b&gt;" in resp.text and "for 10s" in resp.text  # the rule in force, escaped too
    # An incident not yet acknowledged offers its Ack whatever Alertmanager says (here: nothing)
    assert 'class="ack"' in resp.text and 'data-state="triggered"' in resp.text


def test_every_answer_forbids_inline_script_and_framing(console):
    base, _ = console
    for path in ("/", "/pages?run=r1", "/runbook/HeldOutGap", "/static/console.js"):
        csp = requests.get(f"{base}{path}", timeout=10).headers["Content-Security-Policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
    index = requests.get(f"{base}/", timeout=10).text
    assert not re.search(r"<script(?![^>]*\bsrc=\"/static/)", index)  # no inline script, no CDN
    assert not re.search(r"(src|href)=\"https?://(?!127\.0\.0\.1)", index)


def test_the_favicon_a_browser_asks_for_is_the_consoles_own(console):
    base, _ = console
    for path in ("/favicon.ico", "/static/favicon.svg"):
        resp = requests.get(f"{base}{path}", timeout=10)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("image/svg+xml"), path
    assert 'rel="icon" href="/static/favicon.svg"' in requests.get(f"{base}/", timeout=10).text


def test_a_component_that_does_not_answer_is_named_not_a_crash(console):
    base, nowhere = console
    resp = requests.get(f"{base}/", timeout=10)
    assert resp.status_code == 200 and f"Prometheus at {nowhere} did not answer" in resp.text
    resp = requests.get(f"{base}/api/plate", params={"run": "r1"}, timeout=10)
    assert resp.status_code == 503 and resp.json()["error"].startswith("Prometheus at")
    assert requests.get(f"{base}/api/plate", timeout=10).status_code == 400


def test_a_runbook_is_rendered_and_no_path_leaves_the_runbooks(console):
    base, _ = console
    resp = requests.get(f"{base}/runbook/HeldOutGap", timeout=10)
    assert resp.status_code == 200 and "<h1>HeldOutGap</h1>" in resp.text and "<pre><code" in resp.text
    for bad in ("..%2F..%2Fetc%2Fpasswd", "Nope", "Held.Out"):
        assert requests.get(f"{base}/runbook/{bad}", timeout=10).status_code == 404, bad


def test_a_form_without_the_consoles_token_or_from_another_origin_is_refused(console):
    base, _ = console
    form = {"alert": "HtmlPage", "run": "r1", "comment": "x"}
    assert requests.post(f"{base}/ack", data=form, timeout=10).status_code == 403
    token = re.search(r'name="token" value="([^"]+)"', requests.get(f"{base}/?run=r1", timeout=10).text)[1]
    evil = {"Origin": "http://evil.example"}
    assert requests.post(f"{base}/ack", data={**form, "token": token}, headers=evil, timeout=10).status_code == 403
    for path in ("/diagnose", "/postmortem"):
        assert requests.post(f"{base}{path}", data={"run": "r1"}, timeout=10).status_code == 403
    # With the token, from its own page: the ack runs (and says Alertmanager did not answer). A
    # comment that looks like a flag is the comment, not `runwatch ack --help`.
    form["comment"] = "--help"
    resp = requests.post(f"{base}/ack", data={**form, "token": token}, headers={"Origin": base}, timeout=60)
    assert resp.status_code == 200 and "--alertmanager" in resp.text and "did not answer" in resp.text
    assert "usage" not in resp.text


@pytest.mark.parametrize(
    "args, names",
    [(["--port", "70000"], "--port"), (["--prometheus", "ftp://x"], "--prometheus"),
     (["--state-dir", "/nonexistent/state"], "--state-dir")],
)  # fmt: skip
def test_bad_flags_are_one_line(tmp_path, args, names):
    res = runwatch("console", *args, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and names in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = runwatch("console", "--port", str(port), cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and res.stderr == f"runwatch console: 127.0.0.1:{port} is already in use (--port)\n"


def test_the_labs_own_run_is_selected_and_listed_first_from_its_start_and_the_drill_form_fits_it(tmp_path):
    """A console of a lab whose run Prometheus does not hold (it does not even answer): the run
    shown, and the picker's first, is the lab's; the Diagnose form has no default answer and
    offers the cluster's incidents only to a drill of several ranks."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"run_id": "drill-125959", "started_at": 0}))
    nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--state-dir", str(state),
         "--prometheus", nowhere, "--alertmanager", nowhere, "--pager", nowhere],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(f"{base}/-/ready", 30, proc), proc.stderr.read()
        for ranks, cluster in ((1, False), (4, True)):
            drill = {"run_id": "drill-125959", "started_at": 0, "acks": [], "diagnosis": None, "ranks": ranks}
            (state / "drill.json").write_text(json.dumps(drill))
            page = requests.get(f"{base}/", timeout=10).text
            assert 'data-run="drill-125959"' in page
            assert re.search(r'<select name="run" id="run-picker">\s*<option value="drill-125959" selected>', page)
            form = page[page.index('id="diagnose-incident"') :].split("</select>")[0]
            assert '<option value="" selected disabled>' in form and 'value="none"' in form
            assert ('value="straggler"' in form) is cluster, ranks
    finally:
        proc.terminate()
        proc.wait(10)

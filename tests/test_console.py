"""The console's server over real HTTP, without a lab: `runwatch console` reading a real pager,
with Prometheus and Alertmanager not answering. What it shows of hostile pages, what it refuses,
and how it fails. The browser tests on a live lab are in test_console_e2e.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import requests
from prometheus_client import CollectorRegistry

from runwatch.console.sources import Sources
from runwatch.oncall.page_log import read_incidents
from runwatch.oncall.pager_serve import DEFAULT_RUNBOOKS
from runwatch.oncall.server import make_server
from runwatch.prom.server import free_port, wait_ready
from tests.conftest import runwatch

pytestmark = pytest.mark.integration  # a console and a pager of its own, over HTTP

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'
CONSOLE_PROC: dict[int, subprocess.Popen] = {}  # the fixture's console, by port: its memory is measured


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """A pager holding one hostile page, and the console reading it; Prometheus and
    Alertmanager are addresses where nothing listens."""
    tmp = tmp_path_factory.mktemp("console")
    page = {"received_at": "2026-01-01T00:00:01.000Z", "alert": "HtmlPage", "status": "firing", "run_id": "r1",
            "step": "300", "summary": HOSTILE, "description": HOSTILE, "severity": "page",
            "rule": {"expr": "x > 3 <b>", "for": "10s"}}  # fmt: skip
    # a lone surrogate is valid JSON but not UTF-8 (issue 28, item 4): any local process can post one
    lone = {
        **page,
        "alert": "LoneSurrogate",
        "run_id": "r2",
        "summary": "x\ud800y",
        "received_at": "2026-01-01T00:00:02.000Z",
    }
    beside = {**page, "alert": "BesideIt", "run_id": "r2", "summary": "a page of the same run"}
    (tmp / "pages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in (page, lone, beside)))
    pager = make_server("127.0.0.1", 0, tmp / "pages.jsonl", registry=CollectorRegistry(), runbooks=DEFAULT_RUNBOOKS)
    threading.Thread(target=pager.serve_forever, daemon=True).start()
    nowhere = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    spool = tmp / "tmp"  # the console's TMPDIR: where a multipart upload would be spooled
    spool.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere,
         "--alertmanager", nowhere, "--pager", f"http://127.0.0.1:{pager.server_address[1]}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(spool)},
    )  # fmt: skip
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc), proc.stderr.read()
        CONSOLE_PROC[port] = proc
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
     (["--state-dir", "/nonexistent/state"], "--state-dir"),
     (["--pager-token-file", "/nonexistent/pager.token"], "--pager-token-file"),
     (["--pager-token-file", "/dev/null"], "--pager-token-file")],
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
    offers the cluster's incidents, and a rank to name, only to a drill of several ranks."""
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
            assert ('id="diagnose-rank"' in page) is cluster, ranks  # a drill of one process has no rank to name
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_watching_lab_has_no_run_of_its_own_so_the_newest_run_is_shown(tmp_path):
    """Issue 37, item 3: under `up --watch` lab.json's run_id is null, and the console opened on
    a run called "None"."""
    (tmp_path / "lab.json").write_text(json.dumps({"run_id": None, "watch": ["127.0.0.1:8000"], "started_at": 0}))
    nowhere = f"http://127.0.0.1:{free_port()}"
    sources = Sources(prometheus=nowhere, alertmanager=nowhere, pager=nowhere, state_dir=tmp_path)
    assert sources.lab_run() is None
    assert sources.runs_lab_first(["newest", "older"]) == ["newest", "older"]


# --- issue 28: a web page in the learner's browser, and bodies that cost before they are refused ---


def _token(base: str) -> str:
    return re.search(r'name="token" value="([^"]+)"', requests.get(f"{base}/?run=r1", timeout=10).text)[1]


def _raw(base: str, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request as a hostile client writes it (any Host, any length); the status and the answer."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < 12:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def test_a_dns_rebinding_page_gets_no_token_and_drives_nothing(console):
    """Item 2: with Host rebind.attacker.example:PORT (its name, resolved to 127.0.0.1), the page
    was served the form token, and its POST to /ack with the matching Origin made a silence."""
    base, _ = console
    port = base.rsplit(":", 1)[1]
    rebound = f"rebind.attacker.example:{port}"
    resp = requests.get(f"{base}/?run=r1", headers={"Host": rebound}, timeout=10)
    assert resp.status_code == 421 and 'name="token"' not in resp.text
    token = _token(base)  # even with the token (read some other way), nothing runs
    form = {"alert": "HtmlPage", "run": "r1", "comment": "x", "token": token}
    for path in ("/ack", "/diagnose", "/postmortem"):
        resp = requests.post(f"{base}{path}", data=form, headers={"Host": rebound, "Origin": f"http://{rebound}"},
                             timeout=10, allow_redirects=False)  # fmt: skip
        assert resp.status_code == 421, path  # not the 303 of an action that ran
    for own in (f"127.0.0.1:{port}", f"localhost:{port}"):  # the console's own names still serve
        assert requests.get(f"{base}/-/ready", headers={"Host": own}, timeout=10).status_code == 200


def test_big_and_multipart_bodies_are_refused_from_their_headers(console):
    """Item 5: 300 fields of 1 MB took the console from 43 to 349 MB, and a 200 MB multipart upload
    from a foreign Origin was spooled to a temporary file before it was refused. Now Host, Origin
    and Content-Length are read first: the bodies are never read, so nothing grows or spools."""
    base, _ = console
    proc = psutil.Process(CONSOLE_PROC[int(base.rsplit(":", 1)[1])].pid)
    before = proc.memory_info().rss
    host = base.removeprefix("http://")
    fields = "&".join(f"f{i}=" + "x" * (1 << 20) for i in range(300))
    head = f"POST /ack HTTP/1.1\nHost: {host}\nContent-Type: application/x-www-form-urlencoded\n"
    status, _ = _raw(base, head + f"Content-Length: {len(fields)}\n", fields[: 1 << 16].encode())
    assert status == 413
    multipart = f"POST /ack HTTP/1.1\nHost: {host}\nContent-Type: multipart/form-data; boundary=b\n"
    upload = b"--b\r\nContent-Disposition: form-data; name=f; filename=a\r\n\r\n" + b"x" * (1 << 16)
    size = 200 << 20
    assert _raw(base, multipart + f"Origin: http://evil.example\nContent-Length: {size}\n", upload)[0] == 403
    assert _raw(base, multipart + f"Content-Length: {size}\n", upload)[0] == 415  # never a file part
    assert _raw(base, head, b"token=x")[0] == 411  # no Content-Length
    assert list((Path(proc.environ()["TMPDIR"])).iterdir()) == []  # nothing spooled
    assert proc.memory_info().rss - before < 20 << 20  # no body was read into memory
    # the console's own form, small and urlencoded, still works
    token = _token(base)
    form = {"alert": "HtmlPage", "run": "r1", "comment": "ok", "token": token}
    resp = requests.post(f"{base}/ack", data=form, headers={"Origin": base}, timeout=60, allow_redirects=False)
    assert resp.status_code == 303


def test_a_nul_byte_in_a_form_is_a_400_naming_the_field(console):
    """Item 11: a NUL in a form field went into the command line an action runs: a 500."""
    base, _ = console
    form = {"alert": "HtmlPage", "run": "r1", "comment": "a\x00b", "token": _token(base)}
    resp = requests.post(f"{base}/ack", data=form, headers={"Origin": base}, timeout=10, allow_redirects=False)
    assert resp.status_code == 400 and "comment" in resp.text and "NUL" in resp.text


def test_a_lone_surrogate_in_a_page_is_escaped_and_hides_no_page(console):
    """Item 4: one lone surrogate in a stored page made the run's pages pane a 500, hiding every
    page of the run. It is shown escaped, as `runwatch pager` prints it."""
    base, _ = console
    resp = requests.get(f"{base}/pages", params={"run": "r2"}, timeout=10)
    assert resp.status_code == 200
    assert "x\\ud800y" in resp.text and "a page of the same run" in resp.text


def test_a_postmortem_and_its_plate_are_the_state_dirs_own_files(tmp_path):
    """Item 11: a postmortem path escaped through an existing postmortem-* folder, and a
    symlinked plate PNG was served."""
    state = tmp_path / "state"
    (state / "postmortem-a").mkdir(parents=True)
    (state / "postmortem-a" / "postmortem-b.md").write_text("# not the lab's\n")
    (state / "postmortem-r1.md").write_text("# Postmortem r1\n")
    (tmp_path / "secret.png").write_bytes(b"\x89PNG secret")
    (state / "postmortem-r1-plate.png").symlink_to(tmp_path / "secret.png")
    port, nowhere = free_port(), f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere, "--alertmanager",
         nowhere, "--pager", nowhere, "--state-dir", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(f"{base}/-/ready", 30, proc), proc.stderr.read()
        assert requests.get(f"{base}/postmortem/", params={"run": "r1"}, timeout=10).status_code == 200
        for run in ("a/postmortem-b", "a/../postmortem-a/postmortem-b"):
            resp = requests.get(f"{base}/postmortem/", params={"run": run}, timeout=10)
            assert resp.status_code == 404 and "not the lab" not in resp.text, run
        resp = requests.get(f"{base}/postmortem/postmortem-r1-plate.png", timeout=10)
        assert resp.status_code == 404 and b"secret" not in resp.content
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_consoles_ack_carries_the_pagers_token(tmp_path):
    """A pager with a token (the chart's, from its Secret) takes an ack only with it: the console
    started with --pager-token-file passes it to `runwatch ack`, as Alertmanager's webhooks carry it."""
    token = "t0ken-of-the-lab-0123456789abcdef"
    (tmp_path / "pager.token").write_text(token + "\n")
    page = {"received_at": "2026-01-01T00:00:01.000Z", "alert": "HeldOutGap", "status": "firing", "run_id": "r1",
            "fingerprint": "f", "starts_at": "2026-01-01T00:00:00Z", "severity": "page"}  # fmt: skip
    resolved = {**page, "status": "resolved", "received_at": "2026-01-01T00:00:09.000Z"}  # no silence to make
    (tmp_path / "pages.jsonl").write_text(json.dumps(page) + "\n" + json.dumps(resolved) + "\n")
    pager = make_server("127.0.0.1", 0, tmp_path / "pages.jsonl", registry=CollectorRegistry(), token=token)
    threading.Thread(target=pager.serve_forever, daemon=True).start()
    nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere,
         "--alertmanager", nowhere, "--pager", f"http://127.0.0.1:{pager.server_address[1]}",
         "--pager-token-file", str(tmp_path / "pager.token")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(f"{base}/-/ready", 30, proc), proc.stderr.read()
        form_token = re.search(r'name="token" value="([^"]+)"', requests.get(f"{base}/?run=r1", timeout=10).text)[1]
        form = {"alert": "HeldOutGap", "run": "r1", "comment": "train far below held-out", "token": form_token}
        resp = requests.post(f"{base}/ack", data=form, headers={"Origin": base}, timeout=60)
        assert resp.status_code == 200 and "acknowledged HeldOutGap for run r1" in resp.text, resp.text[-2000:]
        assert [i["state"] for i in read_incidents(tmp_path / "pages.jsonl")] == ["resolved"]
    finally:
        proc.terminate()
        proc.wait(10)
        pager.shutdown()


def test_the_consoles_ack_carries_alertmanagers_password(tmp_path):
    """Compose's console has no state directory: --alertmanager-password-file (compose's
    credentials volume) gives `runwatch ack` the password of an Alertmanager that asks every
    request for it, so the Ack's silence is made (issue 40, N19 in compose)."""
    from datetime import UTC, datetime

    from runwatch.core import credentials
    from runwatch.prom.tools import alertmanager_launch, binary
    from tests.conftest import wait_for

    credentials.ensure(tmp_path / "volume", mode=0o644)  # as `runwatch credentials` makes them
    password = credentials.password_file(tmp_path / "volume")
    auth = credentials.from_file(password, "test")
    (tmp_path / "am.yml").write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    am = f"http://127.0.0.1:{free_port()}"
    path = binary("alertmanager")
    web = credentials.folder(tmp_path / "volume") / "web.yml"
    argv = [*alertmanager_launch(path), path, f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'am'}", f"--web.listen-address={am.removeprefix('http://')}",
            "--cluster.listen-address=", f"--web.config.file={web}"]  # fmt: skip
    alertmanager = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    page = {"received_at": "2026-01-01T00:00:01.000Z", "alert": "HeldOutGap", "status": "firing", "run_id": "r1",
            "fingerprint": "f", "starts_at": "2026-01-01T00:00:00Z", "severity": "page"}  # fmt: skip
    (tmp_path / "pages.jsonl").write_text(json.dumps(page) + "\n")
    pager = make_server("127.0.0.1", 0, tmp_path / "pages.jsonl", registry=CollectorRegistry())
    threading.Thread(target=pager.serve_forever, daemon=True).start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = None
    try:

        def ready() -> bool:
            try:
                return requests.get(f"{am}/-/ready", auth=auth, timeout=2).ok
            except requests.RequestException:
                return False

        wait_for(ready, 30, "Alertmanager")
        assert requests.get(f"{am}/api/v2/alerts", timeout=5).status_code == 401  # no password, no answer
        alert = {"labels": {"alertname": "HeldOutGap", "run_id": "r1"}, "startsAt": datetime.now(UTC).isoformat()}
        assert requests.post(f"{am}/api/v2/alerts", json=[alert], auth=auth, timeout=5).ok
        proc = subprocess.Popen(
            [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", am, "--alertmanager", am,
             "--pager", f"http://127.0.0.1:{pager.server_address[1]}", "--alertmanager-password-file", str(password)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert wait_ready(f"{base}/-/ready", 30, proc), proc.stderr.read()
        form_token = re.search(r'name="token" value="([^"]+)"', requests.get(f"{base}/?run=r1", timeout=10).text)[1]
        form = {"alert": "HeldOutGap", "run": "r1", "comment": "held-out far above train", "token": form_token}
        resp = requests.post(f"{base}/ack", data=form, headers={"Origin": base}, timeout=60)
        assert resp.status_code == 200 and "; silence " in resp.text, resp.text[-2000:]
        silences = requests.get(f"{am}/api/v2/silences", auth=auth, timeout=5).json()
        assert [s["comment"] for s in silences] == ["held-out far above train"]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        pager.shutdown()
        alertmanager.terminate()
        alertmanager.wait(10)


def test_a_missing_alertmanager_password_file_is_one_line(tmp_path):
    out = runwatch("console", "--alertmanager-password-file", str(tmp_path / "nothing"), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--alertmanager-password-file" in out.stderr and "nothing" in out.stderr

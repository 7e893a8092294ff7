"""The pager against what any local process can post: hostile text, hostile JSON, a full disk.

Each case was found by attacking the lab (issue 11); the page log must print safely and
completely afterwards, and a failed write must leave nothing that a retry would store twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest
import requests

from runwatch.oncall.app import WORKERS
from runwatch.oncall.page_log import read_incidents, read_pages
from runwatch.oncall.server import HEAD_TIMEOUT_S
from runwatch.prom.server import free_port, wait_ready
from tests.test_pager import Pager, alert, payload

HOSTILE = {
    "lone surrogate": "\ud800",
    "ANSI colour and clear screen": "\x1b[31m\x1b[2J",
    "OSC window title": "\x1b]0;owned\x07",
    "carriage return": "ok\roverwritten",
    "newline forging a page": "x\n12:00:06  FIRING    TrainerDown  run=fake",
    "bidi override": "\u202eevil",
}


def hostile_alert(i: int, text: str) -> dict:
    a = alert(fingerprint=f"hostile{i}")
    a["labels"] = {**a["labels"], "run_id": text, "alertname": f"Hostile{i}{text}"}
    a["annotations"] = {**a["annotations"], "summary": text, "step": text}
    return a


@pytest.fixture
def pager(tmp_path):
    server = Pager(tmp_path / "pages.jsonl")
    yield server
    server.close()


@pytest.mark.integration
def test_a_log_of_hostile_pages_prints_safely_and_completely(pager):
    for i, text in enumerate(HOSTILE.values()):
        assert pager.post(payload(hostile_alert(i, text)))[0] == 200
    assert pager.post(payload(alert(fingerprint="after")))[0] == 200  # a page after them must show

    # A child with a strict UTF-8 stdout, as a terminal is: a lone surrogate used to end it there.
    res = subprocess.run(
        [sys.executable, "-m", "runwatch", "pager", "--log", str(pager.log_path), "--prometheus", ""],
        capture_output=True, timeout=60, env={"PYTHONIOENCODING": "utf-8:strict", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    lines = res.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(HOSTILE) + 1  # one line per page, no forged line
    for byte in (b"\x1b", b"\x07", b"\r", "\u202e".encode()):
        assert byte not in res.stdout
    assert "run=\\ud800" in lines[0] and "run=x\\n12:00:06" in lines[4]
    assert lines[-2].startswith("12:00:05  FIRING    TrainingLossJump")


def test_deeply_nested_json_is_a_400_not_a_dropped_connection(pager):
    status, body = pager.request("POST", "/webhook", b"[" * 200_000)
    assert status == 400
    assert json.loads(body)["field"] == "body" and "nested too deeply" in json.loads(body)["error"]
    assert pager.post(payload())[0] == 200  # and the pager still serves


@pytest.mark.integration
def test_follow_of_a_directory_is_one_line_naming_the_flag(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "runwatch", "pager", "--follow", "--log", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--log" in res.stderr


@pytest.fixture
def pager_process(tmp_path):
    port = free_port()
    log = tmp_path / "pages.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "pager-serve", "--port", str(port), "--log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 20, proc)
    yield psutil.Process(proc.pid), f"http://127.0.0.1:{port}", log
    proc.terminate()
    proc.wait(10)


@pytest.mark.integration
def test_a_full_disk_stores_nothing_then_the_retry_stores_each_page_once(pager_process):
    """The disk fills between the first page and a post of four: nothing of the four is kept,
    /-/ready says why, and Alertmanager's retry after space is freed stores each page once."""
    proc, url, log = pager_process
    assert requests.post(f"{url}/webhook", json=payload(alert(fingerprint="first")), timeout=10).status_code == 200
    size = log.stat().st_size
    # RLIMIT_FSIZE, set from outside (prlimit): writes past it fail with EFBIG, as on a full disk.
    proc.rlimit(psutil.RLIMIT_FSIZE, (size + 300, psutil.RLIM_INFINITY))
    four = payload(*(alert(fingerprint=f"four{i}") for i in range(4)))
    resp = requests.post(f"{url}/webhook", json=four, timeout=10)
    assert resp.status_code == 500 and resp.json()["field"] == "page log"
    assert log.stat().st_size == size  # nothing half-written
    ready = requests.get(f"{url}/-/ready", timeout=10)
    assert ready.status_code == 503 and "cannot append" in ready.text

    proc.rlimit(psutil.RLIMIT_FSIZE, (psutil.RLIM_INFINITY, psutil.RLIM_INFINITY))
    resp = requests.post(f"{url}/webhook", json=four, timeout=10)
    assert resp.json() == {"stored": 4, "duplicates": 0}
    assert [p["fingerprint"] for p in read_pages(log)] == ["first", "four0", "four1", "four2", "four3"]
    assert requests.get(f"{url}/-/ready", timeout=10).status_code == 200
    assert proc.is_running()  # the pager kept serving throughout


# --- issue 28: what a web page in the learner's browser, or a damaged folder, can do ---


def test_a_web_page_cannot_post_pages_to_the_pager(pager):
    """Item 3: a page of another origin ran fetch(".../webhook", {mode: "no-cors", body}) and the
    pager stored the forged page. A browser sends text/plain, an Origin, or (DNS rebinding) its
    own Host; Alertmanager sends none of these, and only its pages are stored."""
    body = json.dumps(payload(alert(fingerprint="forged"))).encode()
    browser = {
        "no-cors fetch": {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example"},
        "an Origin, even with JSON": {"Content-Type": "application/json", "Origin": "null"},
        "a rebound Host": {"Content-Type": "application/json", "Host": f"rebind.attacker.example:{pager.port}"},
        "a form": {"Content-Type": "application/x-www-form-urlencoded"},
    }
    for what, headers in browser.items():
        status, reply = pager.request("POST", "/webhook", body, headers=headers)
        assert status == 403 and json.loads(reply)["field"] == "headers", what
    assert read_pages(pager.log_path) == []
    assert pager.sample("runwatch_pager_rejected_total", reason="foreign") == len(browser)
    assert pager.post(payload(alert(fingerprint="real")))[0] == 200  # Alertmanager's post is stored
    assert [p["fingerprint"] for p in read_pages(pager.log_path)] == ["real"]


def test_a_symlinked_runbook_is_not_served(tmp_path):
    """Item 11: runbooks/X.md -> a secret file was served by the pager, and so by the console,
    which reads runbooks from the pager."""
    (tmp_path / "secret").write_text("root:$6$hash\n")
    runbooks = tmp_path / "runbooks"
    runbooks.mkdir()
    (runbooks / "HeldOutGap.md").write_text("# HeldOutGap\n")
    (runbooks / "Leak.md").symlink_to(tmp_path / "secret")
    server = Pager(tmp_path / "pages.jsonl", runbooks=runbooks)
    try:
        assert server.request("GET", "/runbooks/HeldOutGap.md")[0] == 200
        status, body = server.request("GET", "/runbooks/Leak.md")
        assert status == 404 and b"root" not in body
    finally:
        server.close()


@pytest.mark.integration
def test_ready_is_503_on_a_read_only_log(tmp_path):
    """Item 6: on a read-only page log every POST got a 500 while /-/ready stayed 200, so nothing
    (compose's healthcheck, `runwatch status`) said the pager could not store pages."""
    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "pages.jsonl").write_text("")
    port = free_port()
    serve = [sys.executable, "-m", "runwatch", "pager-serve", "--port", str(port), "--log", str(folder / "pages.jsonl")]
    if os.geteuid() == 0:  # root writes through permission bits: a read-only bind mount, as a ro volume is
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount --bind -o ro "{folder}" "{folder}" && exec "$@"', "sh", *serve]  # fmt: skip
    else:
        (folder / "pages.jsonl").chmod(0o444)
        argv = serve
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_ready(f"{url}/metrics", 20, proc), proc.stderr.read().decode()
        ready = requests.get(f"{url}/-/ready", timeout=10)
        assert ready.status_code == 503 and "cannot append" in ready.text and "pages.jsonl" in ready.text
        resp = requests.post(f"{url}/webhook", json=payload(alert()), timeout=10)
        assert resp.status_code == 500 and resp.json()["field"] == "page log"
        assert requests.get(f"{url}/-/ready", timeout=10).status_code == 503
    finally:
        proc.terminate()
        proc.wait(10)


def test_stalled_connections_hold_no_thread_and_keep_nothing_waiting(tmp_path):
    """Item 11: 8,000 half-open connections gave the pager 6,800 threads, and /-/ready timed out
    for 3.5 minutes after they closed. They now wait in the event loop: past the cap the oldest
    stalled one makes way, so a client that sends its request at once is served."""
    import socket
    import threading

    server = Pager(tmp_path / "pages.jsonl", max_waiting=50)  # the cap, small enough for a test's file limit
    try:
        threads = threading.active_count()
        stalled = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode())  # never ended
            stalled.append(s)
        for _ in range(5):
            assert server.request("GET", "/-/ready")[0] == 200  # served throughout
        assert server.post(payload(alert()))[0] == 200
        assert threading.active_count() <= threads + WORKERS
        assert len(server.server.protocol.room) <= 50
        closed = 0
        for s in stalled[:150]:  # the oldest made way: the server closed them (a reset if their bytes were unread)
            s.settimeout(10)
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == 150
    finally:
        for s in stalled:
            s.close()
        server.close()


def test_a_stalled_request_head_is_closed_after_its_deadline(tmp_path):
    import socket

    head_timeout = 0.5
    server = Pager(tmp_path / "pages.jsonl", head_timeout=head_timeout)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /-/ready HTTP/1.1\r\n")
            s.settimeout(head_timeout + 5)  # the deadline, and a loaded host's slack
            assert s.recv(1) == b""
    finally:
        server.close()


def test_a_web_page_cannot_ack_an_incident_at_the_pager(pager):
    """The pager's POST /api/ack (issue 27) holds to item 3's rule: no browser origin, no foreign
    Host, JSON only; `runwatch ack` posts JSON from a local process."""
    body = json.dumps({"alert": "TrainingLossJump", "run_id": "r", "comment": "x", "by": "evil", "ack_id": "e"})
    for headers in ({"Content-Type": "text/plain", "Origin": "http://evil.example"},
                    {"Content-Type": "application/json", "Origin": "http://evil.example"},
                    {"Content-Type": "application/json", "Host": "rebind.attacker.example"}):  # fmt: skip
        status, reply = pager.request("POST", "/api/ack", body.encode(), headers=headers)
        assert status == 403 and json.loads(reply)["field"] == "headers", headers
    status, _ = pager.request("POST", "/api/ack", body.encode())  # a local client: judged on its body
    assert status in (200, 409)


# --- issue 28, item 11: a page forged by a local process within Alertmanager's window ---

TOKEN = "t0ken-of-the-lab-0123456789abcdef"


@pytest.mark.parametrize("path", ["/webhook", "/watchdog"])
def test_with_a_token_only_a_post_carrying_it_is_taken(tmp_path, path):
    """A page forged a second after its alert resolved is indistinguishable by time from
    Alertmanager's retry of it (notification_window_s): the lab's pager asks for the token
    Alertmanager is given instead, and refuses anything else before reading the body."""
    pager = Pager(tmp_path / "pages.jsonl", token=TOKEN)
    try:
        body = json.dumps(payload(alert(fingerprint="forged"))).encode()
        refused = {
            "no Authorization": {},
            "a wrong token": {"Authorization": "Bearer not-the-lab-s-token-000000"},
            "the token without its scheme": {"Authorization": TOKEN},
            "the token as a prefix": {"Authorization": f"Bearer {TOKEN}x"},
            "basic credentials": {"Authorization": "Basic YWxlcnRtYW5hZ2VyOnB3"},
        }
        for what, headers in refused.items():
            status, reply = pager.request("POST", path, body, headers=headers)
            assert status == 401 and json.loads(reply)["field"] == "Authorization", what
        assert read_pages(pager.log_path) == [] and pager.sample("runwatch_pager_watchdog_last_timestamp_seconds") == 0
        assert pager.sample("runwatch_pager_rejected_total", reason="unauthorized") == len(refused)
        status, _ = pager.request("POST", path, body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        if path == "/webhook":
            assert [p["fingerprint"] for p in read_pages(pager.log_path)] == ["forged"]  # Alertmanager's, stored
        else:
            assert pager.sample("runwatch_pager_watchdog_last_timestamp_seconds") > 0  # a heartbeat heard
    finally:
        pager.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    "content, problem",
    [(None, "cannot read"), ("", "does not hold a token"), ("short\n", "does not hold a token"),
     ("has spaces in it, which no token has\n", "does not hold a token")],
    ids=["missing", "empty", "short", "not a token"],
)  # fmt: skip
def test_a_token_file_the_pager_cannot_use_is_one_line_naming_the_flag(tmp_path, content, problem):
    token_file = tmp_path / "pager.token"
    if content is not None:
        token_file.write_text(content)
    res = subprocess.run(
        [sys.executable, "-m", "runwatch", "pager-serve", "--port", str(free_port()), "--log",
         str(tmp_path / "pages.jsonl"), "--token-file", str(token_file)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("runwatch pager-serve: --token-file: ") and problem in res.stderr
    assert not (tmp_path / "pages.jsonl").exists()


# --- issue 40: acks carry the lab's token, and no slow or tokenless client holds what webhooks need ---

ACK = {"alert": "TrainingLossJump", "run_id": "corrupt_shard-3", "comment": "mine now", "by": "mallory", "ack_id": "m1"}


def test_with_a_token_an_ack_must_carry_it_as_a_webhook_does(tmp_path):
    """N15: the pager took a webhook only with the lab's token, yet any local process could ack
    any incident as anyone. An ack is refused with 401 before its body is read, as a webhook is."""
    pager = Pager(tmp_path / "pages.jsonl", token=TOKEN)
    try:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert pager.request("POST", "/webhook", json.dumps(payload()).encode(), headers=bearer)[0] == 200
        body = json.dumps(ACK).encode()
        for what, headers in {"no Authorization": {}, "a wrong token": {"Authorization": "Bearer not-it-0000000000"},
                              "the token without its scheme": {"Authorization": TOKEN}}.items():  # fmt: skip
            status, reply = pager.request("POST", "/api/ack", body, headers=headers)
            assert status == 401 and json.loads(reply)["field"] == "Authorization", what
        assert [i["state"] for i in read_incidents(pager.log_path)] == ["triggered"]
        status, reply = pager.request("POST", "/api/ack", body, headers=bearer)
        assert status == 200 and json.loads(reply)["incident"]["acked_by"] == "mallory"
    finally:
        pager.close()


def test_webhooks_land_while_tokenless_clients_trickle(tmp_path):
    """N18: 16 tokenless /api/ack bodies trickled at 1 byte every 3 s held all of the old pager's
    16 worker threads, and a webhook carrying the token, and /-/ready, timed out at 40 s. Now 60
    such clients (acks and webhooks without the token, and request heads that never end) trickle
    a byte each well inside every read deadline the pager has; each tokenless POST is refused at
    its head, and webhooks land at once while the heads are still held."""
    import http.client
    import socket
    import threading
    import time

    pager = Pager(tmp_path / "pages.jsonl", token=TOKEN)
    every = HEAD_TIMEOUT_S / 10  # a byte well inside the head's deadline (and the old per-read one)
    host = f"Host: 127.0.0.1:{pager.port}\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n"
    bodies, heads, stop = [], [], threading.Event()
    try:
        for i in range(60):
            s = socket.create_connection(("127.0.0.1", pager.port), timeout=HEAD_TIMEOUT_S)
            if i % 3 == 2:  # a head that never ends
                s.sendall(b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                heads.append(s)
            else:  # a whole head without the token, then its body a byte at a time
                s.sendall(f"POST {('/api/ack', '/webhook')[i % 3]} HTTP/1.1\r\n{host}\r\n".encode())
                bodies.append(s)

        def trickle() -> None:
            while not stop.wait(every):
                for s in bodies + heads:
                    try:
                        s.send(b"x" if s in bodies else b"X")
                    except OSError:  # closed by the pager
                        pass

        threading.Thread(target=trickle, daemon=True).start()
        for s in bodies:  # each refused as soon as its head came, its body never awaited
            assert s.recv(12) == b"HTTP/1.1 401"
        for n in range(5):
            began = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", pager.port, timeout=HEAD_TIMEOUT_S)
            conn.request("POST", "/webhook", json.dumps(payload(alert(fingerprint=f"real{n}"))).encode(),
                         {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            assert conn.getresponse().status == 200 and time.monotonic() - began < HEAD_TIMEOUT_S
            conn.close()
        assert pager.request("GET", "/-/ready")[0] == 200
        for s in heads:  # still held: none has reached its deadline
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        assert [p["fingerprint"] for p in read_pages(pager.log_path)] == [f"real{n}" for n in range(5)]
        assert pager.sample("runwatch_pager_rejected_total", reason="unauthorized") == len(bodies)
    finally:
        stop.set()
        for s in bodies + heads:
            s.close()
        pager.close()


@pytest.mark.integration
def test_runwatch_ack_carries_the_lab_s_token(tmp_path):
    """`runwatch ack` (and so the console's Ack, which runs it with the lab's --state-dir) sends
    the lab's token to the lab's pager, as Alertmanager does; a wrong --token-file is refused,
    naming the flag."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "pager.token").write_text(TOKEN + "\n")
    pager = Pager(state / "pages.jsonl", token=TOKEN)
    try:
        (state / "lab.json").write_text(json.dumps({"urls": {"pager": f"http://127.0.0.1:{pager.port}"}}))
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        for status in ("firing", "resolved"):  # resolved: the ack needs no silence, so no Alertmanager
            assert pager.request("POST", "/webhook", json.dumps(payload(alert(status))).encode(), bearer)[0] == 200
        ack = [sys.executable, "-m", "runwatch", "ack", "TrainingLossJump", "--run", "corrupt_shard-3",
               "--comment", "bad shard?", "--state-dir", str(state)]  # fmt: skip
        (tmp_path / "wrong.token").write_text("not-the-lab-s-token-0000\n")
        res = subprocess.run([*ack, "--token-file", str(tmp_path / "wrong.token")], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert res.returncode == 2 and res.stderr.startswith("runwatch ack: --token-file: the pager refused the ack")
        (tmp_path / "empty.token").write_text("")
        for bad, said in (("missing.token", "cannot read"), ("empty.token", "does not hold a token")):
            res = subprocess.run(
                [*ack, "--token-file", str(tmp_path / bad)], capture_output=True, text=True, timeout=60
            )
            assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
            assert res.stderr.startswith("runwatch ack: --token-file: ") and said in res.stderr
        res = subprocess.run(ack, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert [i["state"] for i in read_incidents(pager.log_path)] == ["resolved"]
    finally:
        pager.close()

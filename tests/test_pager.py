"""The on-call pager over real HTTP on 127.0.0.1: storage, dedup, durability, rejects, metrics, and the follower."""

from __future__ import annotations

import http.client
import io
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from runwatch.core.paths import REPO
from runwatch.oncall.page_log import read_pages
from runwatch.oncall.pager import follow, format_page, main
from runwatch.oncall.pager_serve import main as serve_main
from runwatch.oncall.prometheus import RULES_TIMEOUT_S
from runwatch.oncall.records import rfc3339_ms
from runwatch.oncall.server import SHUTDOWN_GRACE_S, make_server
from runwatch.oncall.watchdog import Watchdog
from runwatch.prom.server import Process, free_port, prometheus_argv
from tests.conftest import edit, need, threshold

NOW = 1714564805.25  # 2024-05-01T12:00:05.250Z
STARTS_AT = "2024-05-01T12:00:00Z"
FINGERPRINT = "5c0ffee0d15ea5e1"


def alert(status: str = "firing", starts_at: str = STARTS_AT, fingerprint: str = FINGERPRINT) -> dict:
    """One alert as Alertmanager sends it, for TrainingLossJump on the corrupt_shard run."""
    return {
        "status": status,
        "labels": {
            "alertname": "TrainingLossJump",
            "severity": "page",
            "run_id": "corrupt_shard-3",
            "job": "trainer",
            "instance": "127.0.0.1:8000",
        },
        "annotations": {
            "summary": "Training loss jumped above its running mean.",
            "description": "Loss on run corrupt_shard-3 is 3.1x its 30s mean at step 300.",
            "runbook_url": "runbooks/TrainingLossJump.md",
            "step": "300",
        },
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2024-05-01T12:01:00Z",
        "generatorURL": "http://127.0.0.1:9090/graph?g0.expr=runwatch%3Aloss",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict) -> dict:
    """An Alertmanager version 4 webhook payload around the given alerts."""
    alerts = alerts or (alert(),)
    return {
        "version": "4",
        "groupKey": '{}:{alertname="TrainingLossJump"}',
        "truncatedAlerts": 0,
        "status": "firing" if any(a.get("status") == "firing" for a in alerts) else "resolved",
        "receiver": "oncall-pager",
        "groupLabels": {"alertname": "TrainingLossJump"},
        "commonLabels": {"alertname": "TrainingLossJump", "severity": "page"},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": list(alerts),
    }


class Pager:
    """A running pager server for one test, with its own registry."""

    def __init__(self, log_path: Path, **kwargs) -> None:
        self.log_path = log_path
        self.registry = CollectorRegistry()
        self.server = make_server("127.0.0.1", 0, log_path, registry=self.registry, clock=lambda: NOW, **kwargs)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            # as Alertmanager posts: JSON (a POST without it is a browser's, and refused)
            sent = {"Content-Type": "application/json"} if method == "POST" else {}
            conn.request(method, path, body=body, headers={**sent, **(headers or {})})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def post(self, obj) -> tuple[int, dict]:
        status, body = self.request("POST", "/webhook", json.dumps(obj).encode())
        return status, json.loads(body)

    def sample(self, name: str, **labels) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def start(tmp_path):
    started = []

    def _start(log_path: Path = tmp_path / "pages.jsonl", **kwargs) -> Pager:
        started.append(Pager(log_path, **kwargs))
        return started[-1]

    yield _start
    for pager in started:
        pager.close()


# --- storing and deduplicating pages ---


def test_firing_notification_is_stored_once_with_all_fields(start):
    pager = start()
    assert pager.post(payload()) == (200, {"stored": 1, "duplicates": 0})
    [page] = read_pages(pager.log_path)
    a = alert()
    assert page == {
        "received_at": "2024-05-01T12:00:05.250Z",
        "alert": "TrainingLossJump",
        "status": "firing",
        "severity": "page",
        "run_id": "corrupt_shard-3",
        "step": "300",
        "summary": a["annotations"]["summary"],
        "description": a["annotations"]["description"],
        "runbook_url": "runbooks/TrainingLossJump.md",
        "rule": None,  # this pager was given no Prometheus to read rules from
        "fingerprint": FINGERPRINT,
        "starts_at": STARTS_AT,
        "ends_at": "0001-01-01T00:00:00Z",
        "labels": a["labels"],
        "annotations": a["annotations"],
    }
    assert pager.sample("runwatch_pager_notifications_total") == 1
    assert pager.sample("runwatch_pager_pages_total", status="firing") == 1
    assert pager.sample("runwatch_pager_last_page_timestamp_seconds") == NOW


# --- the rule in force: a page quotes the threshold that fired it ---


@pytest.fixture
def rules_prometheus(tmp_path):
    """A real Prometheus loading a copy of the project's rules, HeldOutGap edited to 2.5 for 20s."""
    rules = tmp_path / "rules"
    rules.mkdir()
    for f in (REPO / "prometheus" / "rules").glob("*.yml"):
        (rules / f.name).write_text(f.read_text())
    alerts = rules / "alerts.yml"
    shipped = alerts.read_text()
    edit(alerts, threshold("HeldOutGap", "2"), threshold("HeldOutGap", "2.5"))
    edit(alerts, '{alertname="HeldOutGap"})\n        for: 10s', '{alertname="HeldOutGap"})\n        for: 20s')
    (tmp_path / "prometheus.yml").write_text(f"rule_files: ['{rules}/*.yml']\n")
    port = free_port()
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port,
                           "--web.enable-lifecycle")  # fmt: skip
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
        yield f"http://127.0.0.1:{port}", alerts, shipped


def held_out_gap(starts_at: str) -> dict:
    page = alert(starts_at=starts_at, fingerprint="0ddba11")
    page["labels"]["alertname"] = "HeldOutGap"
    return page


@pytest.mark.integration
def test_a_page_stores_the_rule_in_force_and_follows_an_edit(start, rules_prometheus, tmp_path):
    """The threshold and `for:` Prometheus evaluates when the page comes, not the shipped ones:
    the descriptions quote no threshold, and the page line prints the rule."""
    base, alerts, shipped = rules_prometheus
    pager = start(prometheus=base)
    assert pager.post(payload(held_out_gap("2024-05-01T12:00:00Z")))[0] == 200
    [edited] = read_pages(pager.log_path)
    # the alert reads its threshold from a recording rule: the page stores that rule's expression too
    held = 'alert:runwatch_threshold:ratio{alertname="HeldOutGap"}'
    expr = f"run:runwatch_train_heldout_to_train_loss:ratio20s > scalar({held})"
    assert edited["rule"] == {"expr": expr, "for": "20s", "thresholds": {held: "vector(2.5)"}}
    assert format_page(edited).endswith(f"rule: {expr} for 20s; {held} = vector(2.5)")

    alerts.write_text(shipped)
    requests.post(f"{base}/-/reload", timeout=10).raise_for_status()
    assert pager.post(payload(held_out_gap("2024-05-01T12:05:00Z")))[0] == 200
    restored = read_pages(pager.log_path)[-1]
    assert restored["rule"] == {"expr": expr, "for": "10s", "thresholds": {held: "vector(2)"}}
    assert edited["rule"]["thresholds"] == {held: "vector(2.5)"}  # the first page keeps what fired it
    # an alert with no threshold rule (its threshold is in its expression) stores none
    down = held_out_gap("2024-05-01T12:05:30Z")
    down["labels"]["alertname"] = "TrainerDown"
    pager.post(payload(down))
    assert read_pages(pager.log_path)[-1]["rule"]["thresholds"] == {}

    # An alert Prometheus has no rule for (posted by hand): stored, with no rule to quote.
    forged = held_out_gap("2024-05-01T12:06:00Z")
    forged["labels"]["alertname"] = "NoSuchAlert"
    pager.post(payload(forged))
    assert read_pages(pager.log_path)[-1]["rule"] is None
    assert "rule:" not in format_page(read_pages(pager.log_path)[-1])


def test_a_prometheus_that_does_not_answer_delays_pages_at_most_the_rules_timeout(start):
    """A Prometheus that accepts the connection and never answers: the page is stored without
    its rule once RULES_TIMEOUT_S has passed, and the webhook answers 200."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        pager = start(prometheus=f"http://127.0.0.1:{silent.getsockname()[1]}")
        began = time.monotonic()
        assert pager.post(payload()) == (200, {"stored": 1, "duplicates": 0})
        waited = time.monotonic() - began
    finally:
        silent.close()
    assert read_pages(pager.log_path)[0]["rule"] is None
    assert RULES_TIMEOUT_S * 0.9 <= waited < 10  # the client's own timeout: it never waits for Prometheus


def test_the_page_log_is_served_as_json_for_the_console(start):
    """GET /api/pages: what `runwatch pager` prints, oldest first, optionally for one run."""
    pager = start()
    pager.post(payload(alert(), alert(starts_at="2024-05-01T12:01:00Z", fingerprint="0ther")))
    other = alert(fingerprint="run2")
    other["labels"] = {**other["labels"], "run_id": "repeated_batch-4"}
    pager.post(payload(other))
    status, body = pager.request("GET", "/api/pages")
    assert status == 200 and json.loads(body)["pages"] == read_pages(pager.log_path)
    status, body = pager.request("GET", "/api/pages?run_id=repeated_batch-4")
    assert [p["fingerprint"] for p in json.loads(body)["pages"]] == ["run2"]
    assert pager.request("POST", "/api/pages", b"{}")[0] == 405


def test_resent_notification_is_deduplicated(start):
    pager = start()
    pager.post(payload())
    assert pager.post(payload()) == (200, {"stored": 0, "duplicates": 1})
    assert len(pager.log_path.read_text().splitlines()) == 1
    assert pager.sample("runwatch_pager_duplicates_total") == 1
    assert pager.sample("runwatch_pager_notifications_total") == 2
    assert pager.sample("runwatch_pager_pages_total", status="firing") == 1


def test_firing_then_resolved_gives_two_pages(start):
    pager = start()
    pager.post(payload(alert("firing")))
    pager.post(payload(alert("resolved")))
    pager.post(payload(alert("resolved")))
    assert [p["status"] for p in read_pages(pager.log_path)] == ["firing", "resolved"]
    assert pager.sample("runwatch_pager_pages_total", status="resolved") == 1
    assert pager.sample("runwatch_pager_duplicates_total") == 1


def test_refire_with_new_starts_at_is_a_new_page(start):
    pager = start()
    pager.post(payload(alert("firing")))
    pager.post(payload(alert("resolved")))
    pager.post(payload(alert("firing", starts_at="2024-05-01T12:05:00Z")))
    assert [(p["status"], p["starts_at"]) for p in read_pages(pager.log_path)] == [
        ("firing", STARTS_AT),
        ("resolved", STARTS_AT),
        ("firing", "2024-05-01T12:05:00Z"),
    ]


def test_repeat_inside_one_notification_is_stored_once(start):
    pager = start()
    assert pager.post(payload(alert(), alert())) == (200, {"stored": 1, "duplicates": 1})


def test_log_survives_a_restart(start):
    first = start()
    first.post(payload())
    first.close()
    second = start(first.log_path)
    assert second.post(payload()) == (200, {"stored": 0, "duplicates": 1})
    assert len(read_pages(second.log_path)) == 1
    assert second.sample("runwatch_pager_duplicates_total") == 1
    assert second.sample("runwatch_pager_last_page_timestamp_seconds") == NOW


def test_concurrent_posts_do_not_interleave_lines(start):
    pager = start()
    threads = [threading.Thread(target=pager.post, args=(payload(alert(fingerprint=f"fp{i:02d}")),)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = pager.log_path.read_text().splitlines()
    assert sorted(json.loads(line)["fingerprint"] for line in lines) == [f"fp{i:02d}" for i in range(20)]


# --- rejected requests store nothing ---


def _bad(mutate) -> bytes:
    body = payload(alert(fingerprint="other"), alert(fingerprint="second"))
    mutate(body)
    return json.dumps(body).encode()


MALFORMED = {
    "not_json": (b'{"alerts": [', "body"),
    "not_utf8": (b"\xff\xfe\x00", "body"),
    "not_an_object": (b"[]", "body"),
    "alerts_missing": (_bad(lambda p: p.pop("alerts")), "alerts"),
    "alerts_not_a_list": (_bad(lambda p: p.update(alerts={"0": alert()})), "alerts"),
    "bad_status": (_bad(lambda p: p["alerts"][1].update(status="pending")), "alerts[1].status"),
    "missing_status": (_bad(lambda p: p["alerts"][1].pop("status")), "alerts[1].status"),
    "missing_fingerprint": (_bad(lambda p: p["alerts"][1].pop("fingerprint")), "alerts[1].fingerprint"),
    "missing_starts_at": (_bad(lambda p: p["alerts"][0].pop("startsAt")), "alerts[0].startsAt"),
    "missing_labels": (_bad(lambda p: p["alerts"][1].pop("labels")), "alerts[1].labels"),
    "non_string_label": (_bad(lambda p: p["alerts"][1]["labels"].update(step=300)), "alerts[1].labels.step"),
    "labels_not_a_map": (_bad(lambda p: p["alerts"][1].update(labels=["a"])), "alerts[1].labels"),
    "non_string_annotation": (_bad(lambda p: p["alerts"][1]["annotations"].update(x=None)), "alerts[1].annotations.x"),
}


@pytest.mark.parametrize("body, field", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_payload_is_rejected_naming_the_field(start, body, field):
    pager = start()
    pager.post(payload())
    before = pager.log_path.read_bytes()
    status, reply = pager.request("POST", "/webhook", body)
    assert status == 400
    assert reply.count(b"\n") == 1 and json.loads(reply)["field"] == field
    assert json.loads(reply)["error"].startswith(f"{field}: ")
    assert pager.log_path.read_bytes() == before
    assert pager.sample("runwatch_pager_rejected_total", reason="malformed") == 1
    assert pager.sample("runwatch_pager_notifications_total") == 1


def test_oversized_body_is_rejected_with_413(start):
    pager = start(max_body=2048)
    pager.post(payload())
    before = pager.log_path.read_bytes()
    big = payload(*(alert(fingerprint=f"fp{i}") for i in range(20)))
    status, reply = pager.request("POST", "/webhook", json.dumps(big).encode())
    assert status == 413 and json.loads(reply)["field"] == "body"
    assert pager.log_path.read_bytes() == before
    assert pager.sample("runwatch_pager_rejected_total", reason="too_large") == 1


def test_missing_content_length_is_411(start):
    pager = start()
    conn = http.client.HTTPConnection("127.0.0.1", pager.port, timeout=10)
    conn.putrequest("POST", "/webhook")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()
    assert not pager.log_path.exists()


@pytest.mark.parametrize("length", ["abc", "-5"])
def test_bad_content_length_is_400(start, length):
    pager = start()
    status, reply = pager.request("POST", "/webhook", headers={"Content-Length": length})
    assert status == 400 and json.loads(reply)["field"] == "Content-Length"
    assert not pager.log_path.exists()


def test_wrong_path_is_404_and_wrong_method_is_405(start):
    pager = start()
    assert pager.request("POST", "/api/v2/alerts", b"{}")[0] == 404
    assert pager.request("GET", "/webhook")[0] == 405
    assert pager.request("POST", "/metrics", b"")[0] == 405


def test_health_and_readiness(start):
    pager = start()
    assert pager.request("GET", "/-/healthy") == (200, b"OK\n")
    assert pager.request("GET", "/-/ready") == (200, b"OK\n")


# --- crash recovery ---


def test_torn_last_line_is_skipped_and_next_append_starts_a_new_line(start, tmp_path, capsys):
    log_path = tmp_path / "pages.jsonl"
    good = json.dumps({"fingerprint": "old", "starts_at": STARTS_AT, "status": "firing", "alert": "Old"})
    log_path.write_text(good + '\n{"received_at": "2024-05-01T12:00:0')
    pager = start(log_path)
    assert "skipping unreadable line 2" in capsys.readouterr().err
    assert pager.post(payload()) == (200, {"stored": 1, "duplicates": 0})
    lines = log_path.read_text().split("\n")
    assert lines[1] == '{"received_at": "2024-05-01T12:00:0'
    assert json.loads(lines[2])["fingerprint"] == FINGERPRINT and lines[3] == ""
    assert [p["fingerprint"] for p in read_pages(log_path)] == ["old", FINGERPRINT]


# --- metrics ---


def test_metrics_endpoint_parses(start):
    pager = start()
    pager.post(payload())
    pager.post(payload())
    status, body = pager.request("GET", "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    for name in ("runwatch_pager_notifications", "runwatch_pager_pages", "runwatch_pager_duplicates"):
        assert families[name].type == "counter" and families[name].documentation.endswith(".")
    assert families["runwatch_pager_last_page_timestamp_seconds"].type == "gauge"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("runwatch_pager_pages_total", (("status", "firing"),))] == 1
    assert samples[("runwatch_pager_duplicates_total", ())] == 1
    assert samples[("runwatch_pager_rejected_total", (("reason", "too_large"),))] == 0


# --- the follower ---

PAGE = {
    "received_at": "2024-05-01T12:00:05.250Z",
    "alert": "TrainingLossJump",
    "status": "firing",
    "run_id": "corrupt_shard-3",
    "step": "300",
    "summary": "Training loss jumped above its running mean.",
    "runbook_url": "runbooks/TrainingLossJump.md",
}
LINE = (
    "12:00:05  FIRING    TrainingLossJump      run=corrupt_shard-3  step=300  "
    "Training loss jumped above its running mean.  runbook: http://127.0.0.1:9095/runbooks/TrainingLossJump.md"
)


def test_format_page():
    assert format_page(PAGE) == LINE
    resolved = format_page({**PAGE, "status": "resolved"})
    assert resolved.startswith("12:00:05  RESOLVED  TrainingLossJump      run=")


@pytest.mark.parametrize(
    "runbook_url, expected",
    [
        ("http://127.0.0.1:9095/runbooks/TrainingLossJump.md", "http://127.0.0.1:9095/runbooks/TrainingLossJump.md"),
        ("https://wiki.example/oncall/loss", "https://wiki.example/oncall/loss"),  # a URL opens: print it
        # a page of an older rule file, with a relative path: the pager's copy, which opens
        ("runbooks/TrainingLossJump.md", "http://127.0.0.1:9095/runbooks/TrainingLossJump.md"),
        ("", "http://127.0.0.1:9095/runbooks/TrainingLossJump.md"),
    ],
)
def test_format_page_runbook_path(runbook_url, expected):
    assert format_page({**PAGE, "runbook_url": runbook_url}).endswith(f"runbook: {expected}")


def test_format_page_is_one_line_with_missing_fields():
    line = format_page({"alert": "GradNormSpike", "status": "firing", "summary": "two\nlines"})
    assert "\n" not in line and "run=-  step=-  two lines" in line


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class _Polls(threading.Event):
    """follow()'s stop event, which also counts the polls follow() waits between: a test waits
    for follow() to have read the log again, not for a guessed number of seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.polled = 0, threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self.polled:
            self.count += 1
            self.polled.notify_all()
        return super().wait(timeout)

    def read_again(self) -> None:
        """Return once follow() has read the log at least once more from now."""
        with self.polled:
            target = self.count + 2  # the read in progress may have begun before now
            assert self.polled.wait_for(lambda: self.count >= target, timeout=5), "follow() stopped polling"


def test_follow_prints_existing_then_appended_pages(tmp_path):
    log_path = tmp_path / "pages.jsonl"
    out, stop = io.StringIO(), _Polls()
    thread = threading.Thread(target=follow, args=(log_path, out), kwargs={"poll": 0.01, "stop": stop})
    thread.start()
    try:
        stop.read_again()  # it has looked for the log, which does not exist yet
        log_path.write_text(json.dumps(PAGE) + "\n")
        _wait_for(lambda: out.getvalue() == LINE + "\n")
        later = json.dumps({**PAGE, "status": "resolved"})
        with open(log_path, "a") as f:
            f.write(later[:20])  # half-written line: not printed until its newline
            f.flush()
            stop.read_again()
            assert out.getvalue().count("\n") == 1
            f.write(later[20:] + "\n")
        _wait_for(lambda: "RESOLVED" in out.getvalue())
        assert out.getvalue().count("\n") == 2
    finally:
        stop.set()
        thread.join(5)


def test_follow_without_follow_prints_and_returns(tmp_path):
    log_path = tmp_path / "pages.jsonl"
    log_path.write_text(json.dumps(PAGE) + "\n" + json.dumps({**PAGE, "status": "resolved"})[:30])
    out = io.StringIO()
    follow(log_path, out, follow=False)
    assert out.getvalue() == LINE + "\n"


def test_follow_hides_the_pages_of_earlier_labs_and_says_so(tmp_path, capsys):
    """A drill's pager starts with the pages of earlier labs in the same state directory: only
    this lab's are shown (its lab.json says when it started), unless --all."""
    log_path = tmp_path / "pages.jsonl"
    old = {**PAGE, "received_at": "2024-05-01T11:00:00.000Z", "alert": "OldAlert"}
    log_path.write_text(json.dumps(old) + "\n" + json.dumps(PAGE) + "\n")
    (tmp_path / "lab.json").write_text(json.dumps({"run_id": "x", "started_at": NOW - 60}))
    assert main(["--log", str(log_path), "--prometheus", ""]) == 0
    out, err = capsys.readouterr()
    assert out == LINE + "\n" and "1 earlier page(s), from before this lab started, are hidden (--all)" in err
    assert main(["--log", str(log_path), "--prometheus", "", "--all"]) == 0
    assert "OldAlert" in capsys.readouterr().out


@pytest.mark.integration
def test_follow_says_it_is_listening(tmp_path):
    """--follow on a quiet log: a line on stderr says it is waiting, and since when."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "pager", "--follow", "--log", str(tmp_path / "pages.jsonl"),
         "--prometheus", ""],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert line.startswith(f"runwatch pager: following {tmp_path / 'pages.jsonl'} from ") and "Ctrl-C" in line


def test_no_page_log_advises_a_command_that_exists(tmp_path, capsys):
    assert main(["--log", str(tmp_path / "nope.jsonl"), "--prometheus", ""]) == 1
    err = capsys.readouterr().err
    assert "runwatch up" in err and "pager-serve" not in err and err.count("\n") == 1


def test_a_running_lab_without_a_page_yet_says_so(tmp_path, capsys):
    """Not "start a lab": there is one (its lab.json), and its pager has not paged yet."""
    (tmp_path / "lab.json").write_text(json.dumps({"run_id": "none-0-000000", "started_at": NOW}))
    assert main(["--log", str(tmp_path / "pages.jsonl"), "--prometheus", ""]) == 0
    err = capsys.readouterr().err
    assert err.startswith("runwatch pager: no page yet") and "runwatch up" not in err


# --- command lines ---


def test_pager_cli_prints_the_log(tmp_path, capsys):
    log_path = tmp_path / "pages.jsonl"
    log_path.write_text(json.dumps(PAGE) + "\n")
    assert main(["--log", str(log_path), "--prometheus", ""]) == 0
    assert capsys.readouterr().out == LINE + "\n"


def test_pager_cli_bad_flag_is_one_line_and_exit_2(capsys):
    assert main(["--tail"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tail" in err


def test_serve_cli_bad_port_names_the_flag(capsys):
    assert serve_main(["--port", "http"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--port" in err


def test_serve_cli_busy_port(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert serve_main(["--port", str(port), "--log", str(tmp_path / "pages.jsonl")]) == 2
    assert capsys.readouterr().err == f"runwatch pager-serve: port {port} is already in use (--port)\n"


def test_runbooks_are_served_and_nothing_outside_them(tmp_path):
    import urllib.error
    import urllib.request

    from runwatch.oncall.pager_serve import DEFAULT_RUNBOOKS

    server = make_server(
        "127.0.0.1", 0, tmp_path / "pages.jsonl", registry=CollectorRegistry(), runbooks=DEFAULT_RUNBOOKS
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/runbooks/HeldOutGap.md") as resp:
            assert resp.status == 200 and b"# HeldOutGap" in resp.read()
        # The folder's address opens its index; the pager's own address lists routes and runbooks.
        for index in ("/runbooks", "/runbooks/"):
            with urllib.request.urlopen(f"{base}{index}") as resp:
                assert resp.status == 200 and b"runbook" in resp.read().lower()
        with urllib.request.urlopen(f"{base}/") as resp:
            root = resp.read().decode()
        assert "POST /webhook" in root and "http://127.0.0.1:9095/runbooks/HeldOutGap.md" in root
        for bad in ("../README.md", "..%2FREADME.md", "Nope.md", "HeldOutGap.txt"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{base}/runbooks/{bad}")
            assert err.value.code == 404, bad
    finally:
        server.shutdown()


# --- the dead-man's switch and a clean stop ---


def watchdog_payload(status: str = "firing") -> dict:
    beat = {**alert(status), "labels": {"alertname": "Watchdog", "severity": "none"}, "fingerprint": "d06"}
    return payload(beat)


def test_the_watchdog_pages_once_past_its_timeout_and_its_return_resolves():
    """The dead-man's switch, a pure function of an injected clock: no server, no waiting."""
    dog = Watchdog(timeout=30)
    assert dog.check(NOW) is None and dog.check(NOW + 1e6) is None  # not armed before the first heartbeat
    assert dog.beat(NOW) is None  # a heartbeat is not a page
    assert dog.check(NOW + 30) is None  # at the timeout, not yet past it
    page = dog.check(NOW + 31)
    assert (page["alert"], page["status"], page["severity"]) == ("WatchdogSilent", "firing", "critical")
    assert "31s" in page["description"] and page["runbook_url"].endswith("/runbooks/WatchdogSilent.md")
    assert page["starts_at"] == rfc3339_ms(NOW)  # silent since the last heartbeat
    assert dog.check(NOW + 60) is None  # still silent: no second page
    back = dog.beat(NOW + 61)
    assert (back["status"], back["starts_at"], back["fingerprint"]) == ("resolved", page["starts_at"], "pager-watchdog")
    assert dog.beat(NOW + 62) is None and dog.check(NOW + 62) is None


class _Once(threading.Event):
    """A stop event that lets the watch loop check once, then stops it: the loop runs in the test's
    own thread, and nothing waits."""

    def wait(self, timeout: float | None = None) -> bool:
        done = self.is_set()
        self.set()
        return done


def test_the_pager_hears_the_heartbeat_and_stores_its_silence_once(tmp_path):
    """Over HTTP: a firing Watchdog is the heartbeat (a resolved one is not), the watch loop
    stores the silence once, and the next heartbeat stores its resolution."""
    now = [NOW]
    registry = CollectorRegistry()
    server = make_server("127.0.0.1", 0, tmp_path / "pages.jsonl", registry=registry, clock=lambda: now[0],
                         watchdog_timeout=30)  # fmt: skip
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def post(obj: dict) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("POST", "/watchdog", body=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
        return conn.getresponse().status

    try:
        assert post(watchdog_payload()) == 200
        assert registry.get_sample_value("runwatch_pager_watchdog_last_timestamp_seconds") == NOW
        assert read_pages(tmp_path / "pages.jsonl") == []  # a heartbeat is not a page
        now[0] = NOW + 31
        assert post(watchdog_payload("resolved")) == 200  # Prometheus stopped: not a heartbeat
        assert registry.get_sample_value("runwatch_pager_watchdog_last_timestamp_seconds") == NOW
        server.watch(_Once())
        server.watch(_Once())  # still silent: no second page
        pages = read_pages(tmp_path / "pages.jsonl")
        assert [(p["alert"], p["status"]) for p in pages] == [("WatchdogSilent", "firing")]
        now[0] = NOW + 40
        assert post(watchdog_payload()) == 200
        pages = read_pages(tmp_path / "pages.jsonl")
        assert [(p["alert"], p["status"]) for p in pages] == [
            ("WatchdogSilent", "firing"),
            ("WatchdogSilent", "resolved"),
        ]
        assert registry.get_sample_value("runwatch_pager_pages_total", {"status": "firing"}) == 1
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.integration
def test_serve_stops_cleanly_on_sigterm_however_soon_it_comes(tmp_path):
    """As PID 1 in a container a Python without a SIGTERM handler ignores it: `docker compose stop`
    would wait 10 s and SIGKILL it. Eight pagers, each sent SIGTERM the moment its port answers:
    one in five once died of SIGINT (a KeyboardInterrupt raised inside an import's generated
    code) or printed a traceback (inside the event loop's construction). Each must exit 0."""
    import subprocess
    import sys

    from tests.conftest import free_port

    procs = {}
    for n in range(8):
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "runwatch",
            "pager-serve",
            "--port",
            str(port),
            "--log",
            str(tmp_path / f"{n}.jsonl"),
        ]
        procs[port] = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        waiting = set(procs)
        while waiting and time.monotonic() < deadline:
            for port in sorted(waiting):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                except OSError:
                    continue
                procs[port].terminate()
                waiting.discard(port)
        assert not waiting, "a pager never answered"
        for proc in procs.values():
            assert proc.wait(timeout=SHUTDOWN_GRACE_S + 5) == 0
            assert "Traceback" not in proc.stderr.read()
    finally:
        for proc in procs.values():
            proc.kill()


def test_serve_cli_bad_watchdog_timeout_names_the_flag(capsys):
    for bad in ("0", "-1", "soon", "1e9"):
        assert serve_main(["--watchdog-timeout", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--watchdog-timeout" in err, err

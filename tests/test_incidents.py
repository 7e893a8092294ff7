"""Incidents in the pager over real HTTP on 127.0.0.1: one per alert of a run, open until a person
acks it (with a comment) and its alert has resolved, re-firing joins it, each ack kept once.

The pager never decides whether an alert fired: these tests post what Alertmanager posts and
read what the pager groups, acks and prints.
"""

from __future__ import annotations

import http.client
import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from runwatch.oncall.incidents import incidents, time_to_ack
from runwatch.oncall.page_log import PageLog, read_incidents, read_log, read_pages
from runwatch.oncall.pager import format_page
from runwatch.oncall.pager import main as pager_main
from runwatch.oncall.server import make_server
from tests.test_pager import NOW, alert, payload


class Clocked:
    """A pager on a free port whose clock the test moves (seconds after NOW)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path, self.t = log_path, 0.0
        self.server = make_server("127.0.0.1", 0, log_path, registry=CollectorRegistry(), clock=lambda: NOW + self.t)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def call(self, method: str, path: str, obj=None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            sent = {"Content-Type": "application/json"} if obj is not None else {}  # as Alertmanager and `ack` post
            conn.request(method, path, body=None if obj is None else json.dumps(obj).encode(), headers=sent)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def at(self, t: float, *alerts: dict) -> None:
        self.t = t
        assert self.call("POST", "/webhook", payload(*alerts))[0] == 200

    def ack(self, t: float, **fields) -> tuple[int, dict]:
        self.t = t
        body = {"alert": "TrainingLossJump", "run_id": "corrupt_shard-3", "comment": "bad shard?", "by": "ada",
                "ack_id": "a1", **fields}  # fmt: skip
        return self.call("POST", "/api/ack", body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pager(tmp_path):
    one = Clocked(tmp_path / "pages.jsonl")
    yield one
    one.close()


def test_an_incident_stays_open_after_its_alert_resolves_until_a_person_acks_it(pager):
    pager.at(0, alert("firing"))
    pager.at(10, alert("resolved"))
    [incident] = pager.call("GET", "/api/incidents?run_id=corrupt_shard-3")[1]["incidents"]
    assert incident["state"] == "triggered" and not incident["firing"] and incident["acked_at"] == ""
    # A minute after its alert resolved, the ack still takes it, and closes it.
    status, body = pager.ack(70)
    assert status == 200 and body["incident"]["state"] == "resolved"
    [incident] = read_incidents(pager.log_path, "corrupt_shard-3")
    assert (incident["acked_by"], incident["comment"]) == ("ada", "bad shard?")
    assert time_to_ack(incident) == 70.0  # from the first page, whatever the alert did since
    assert [e["what"] for e in incident["events"]] == ["fired", "resolved", "acknowledged"]
    assert len(read_pages(pager.log_path)) == 2  # an ack is no page


def test_an_acked_incident_stays_acknowledged_while_its_alert_fires_and_re_firing_joins_it(pager):
    pager.at(0, alert("firing"))
    assert pager.ack(5)[1]["incident"]["state"] == "acknowledged"
    pager.at(10, alert("resolved"))
    pager.at(20, alert("firing", starts_at="2024-05-01T12:00:20Z"))  # fires again: the same incident
    [incident] = read_incidents(pager.log_path)
    assert incident["state"] == "acknowledged" and len(incident["pages"]) == 3
    assert [e["what"] for e in incident["events"]] == ["fired", "acknowledged", "resolved", "fired"]


def test_incidents_list_open_ones_oldest_first_then_the_resolved(pager):
    other = {**alert(), "labels": {**alert()["labels"], "alertname": "GradientNormJump"}, "fingerprint": "9"}
    held = {**alert(), "labels": {**alert()["labels"], "alertname": "HeldOutGap"}, "fingerprint": "8"}
    pager.at(0, alert("firing"))
    pager.at(1, other)
    pager.at(2, held)
    pager.at(3, alert("resolved"))
    pager.ack(4)  # TrainingLossJump: acked and resolved, so closed
    found = [i["alert"] for i in pager.call("GET", "/api/incidents")[1]["incidents"]]
    assert found == ["GradientNormJump", "HeldOutGap", "TrainingLossJump"]


@pytest.mark.parametrize(
    ("fields", "code", "said"),
    [({"comment": " "}, 400, "comment: must not be empty"), ({"by": ""}, 400, "by: must not be empty"),
     ({"alert": 3}, 400, "alert: must be a string"), ({"ack_id": None}, 400, "ack_id: must be a string"),
     ({"alert": "HeldOutGap"}, 409, "HeldOutGap has no incident for run corrupt_shard-3: it has not paged"),
     ({"run_id": "other"}, 409, "TrainingLossJump has no incident for run other")],
)  # fmt: skip
def test_a_bad_or_pointless_ack_is_refused_naming_why_and_stores_nothing(pager, fields, code, said):
    pager.at(0, alert("firing"))
    status, body = pager.ack(1, **fields)
    assert status == code and said in body["error"]
    assert len(read_log(pager.log_path)) == 1


def test_a_second_ack_is_refused_and_a_retried_one_is_kept_once_across_a_restart(pager, tmp_path):
    pager.at(0, alert("firing"))
    assert pager.ack(1)[0] == 200
    assert pager.ack(2)[0] == 200  # the same ack_id: a retry, answered again, stored once
    status, body = pager.ack(3, ack_id="a2", by="bob")
    assert (
        status == 409
        and body["error"] == "TrainingLossJump of run corrupt_shard-3 was already acknowledged by ada at 12:00:06"
    )
    assert sum(e.get("kind") == "ack" for e in read_log(pager.log_path)) == 1
    # A pager killed and restarted on the log (kill -9 loses no fsynced line) knows the ack.
    log = PageLog(pager.log_path)
    assert log.acknowledge({**read_log(pager.log_path)[-1]})[0]["acked_by"] == "ada"
    assert sum(e.get("kind") == "ack" for e in read_log(pager.log_path)) == 1


def test_runwatch_pager_prints_the_ack_and_the_incidents_still_to_ack(pager, capsys):
    other = {**alert(), "labels": {**alert()["labels"], "alertname": "HeldOutGap"}, "fingerprint": "8"}
    pager.at(0, alert("firing"), other)
    pager.ack(12, comment="looking\nat the loss")
    assert pager_main(["--log", str(pager.log_path), "--prometheus", ""]) == 0
    out, err = capsys.readouterr()
    assert (
        out.splitlines()[2]
        == "12:00:17  ACKED     TrainingLossJump      run=corrupt_shard-3  by ada: looking at the loss"
    )
    assert err.splitlines()[-1] == (
        "runwatch pager: 1 incident(s) unacknowledged: HeldOutGap (run corrupt_shard-3); "
        "`runwatch ack ALERT --comment ...`, or see `runwatch pager --incidents`"
    )
    assert pager_main(["--log", str(pager.log_path), "--incidents"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["ACKNOWLEDGED", "TrainingLossJump"]  # open, oldest first (the same second)
    assert "acked 12:00:17 by ada (12.0 s after the first page): looking at the loss" in out[0]
    assert out[1].split()[:2] == ["TRIGGERED", "HeldOutGap"] and out[1].endswith("unacknowledged")


def test_an_ack_of_no_incident_in_a_hand_made_log_is_left_out():
    lines = [{"kind": "ack", "alert": "A", "run_id": "r", "received_at": "2024-05-01T12:00:00.000Z"}]
    assert incidents(lines) == []


@pytest.mark.integration
def test_a_resolved_page_stores_what_its_rule_measured_when_it_resolved(tmp_path):
    """Alertmanager's resolution carries the last firing description ("2.2x"): the pager asks a
    real Prometheus for the rule's measure at the resolution instead, for either comparison."""
    from runwatch.prom.server import Process, free_port, prometheus_argv
    from tests.conftest import need

    rules = tmp_path / "rules.yml"
    rules.write_text("""groups:
  - name: t
    interval: 1s
    rules:
      - record: alert:runwatch_threshold:ratio
        labels: {alertname: Gap}
        expr: vector(2)
      - record: alert:runwatch_threshold:ratio
        labels: {alertname: Drop}
        expr: vector(0.8)
      - alert: Gap
        expr: >-
          label_replace(vector(1.62), "run_id", "r", "", "")
          > scalar(alert:runwatch_threshold:ratio{alertname="Gap"})
      - alert: Drop
        expr: >-
          label_replace(vector(0.9), "run_id", "r", "", "")
          < scalar(alert:runwatch_threshold:ratio{alertname="Drop"})
      - alert: Down
        expr: label_replace(vector(0), "run_id", "r", "", "") == 0
""")
    (tmp_path / "prometheus.yml").write_text(f"rule_files: ['{rules}']\n")
    port = free_port()
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
        server = make_server("127.0.0.1", 0, tmp_path / "pages.jsonl", registry=CollectorRegistry(),
                             prometheus=f"http://127.0.0.1:{port}")  # fmt: skip
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            ends = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            for name in ("Gap", "Drop", "Down"):
                page = {**alert("resolved"), "fingerprint": name, "endsAt": ends}
                page["labels"] = {"alertname": name, "run_id": "r", "severity": "page"}
                for status in ("firing", "resolved"):
                    body = json.dumps(payload({**page, "status": status})).encode()
                    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
                    conn.request("POST", "/webhook", body=body, headers={"Content-Type": "application/json"})
                    assert conn.getresponse().status == 200
                    conn.close()
        finally:
            server.shutdown()
            server.server_close()
    found = {(p["alert"], p["status"]): p for p in read_pages(tmp_path / "pages.jsonl")}
    assert found[("Gap", "resolved")]["value_at_resolution"] == 1.62
    assert found[("Drop", "resolved")]["value_at_resolution"] == 0.9
    assert found[("Down", "resolved")].get("value_at_resolution") is None  # no threshold rule: cannot say
    assert "value_at_resolution" not in found[("Gap", "firing")]
    assert "  measured 1.62 at resolution  runbook: " in format_page(found[("Gap", "resolved")])

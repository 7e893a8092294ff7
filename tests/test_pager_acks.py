"""An ack_id names one acknowledgment (issue 40, N17): a retry of the same ack is kept once, and
the same id sent for another incident, or for an alert that never paged, is refused with a 409
that says so, over real HTTP, never a 200 that leaves the incident triggered or a dropped
connection (a KeyError in the pager)."""

from __future__ import annotations

from runwatch.oncall.page_log import read_incidents
from tests.test_incidents import pager  # noqa: F401 (the fixture: a pager on a free port)
from tests.test_pager import alert


def second_alert() -> dict:
    """GradientNormJump on the same run: an incident of its own."""
    other = alert(fingerprint="0ddba11")
    return {**other, "labels": {**other["labels"], "alertname": "GradientNormJump"}}


def test_an_ack_id_reused_for_another_incident_is_refused(pager):  # noqa: F811
    pager.at(0, alert(), second_alert())
    status, body = pager.ack(5)
    assert status == 200 and body["incident"]["alert"] == "TrainingLossJump"
    assert pager.ack(6)[0] == 200  # the same ack again (a retry): kept once, its incident again
    status, body = pager.ack(7, alert="GradientNormJump")  # the same ack_id, another incident
    assert status == 409 and "ack_id a1" in body["error"] and "TrainingLossJump" in body["error"], body
    states = {i["alert"]: i["acked_at"] for i in read_incidents(pager.log_path, "corrupt_shard-3")}
    assert states["TrainingLossJump"] and states["GradientNormJump"] == ""
    assert pager.ack(8, alert="GradientNormJump", ack_id="a2")[0] == 200  # a new id takes it


def test_an_ack_id_reused_for_an_alert_that_never_paged_is_a_409_not_a_dropped_connection(pager):  # noqa: F811
    pager.at(0, alert())
    assert pager.ack(5)[0] == 200
    status, body = pager.ack(6, alert="HeldOutGap")
    assert status == 409 and "ack_id a1" in body["error"], body

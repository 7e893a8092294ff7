"""The on-call console in a real browser (Debian's chromium, driven by Playwright) on the
worker's shared lab: `runwatch up` serves it (on the lab's own port; 9096 by default).

The curves appear and follow the run, a page shows within 3 s of the pager storing it, HTML in a
page is shown as text, the runbook renders, Ack creates the silence in Alertmanager, and an
incident whose alert resolved while the learner read its runbook stays open and takes the ack.
Diagnosing a drill in the browser is in test_drill_e2e.py (a drill is a lab of its own).
"""

from __future__ import annotations

import time

import requests
import yaml

from runwatch.core.paths import REPO
from runwatch.oncall.incidents import time_to_ack
from runwatch.oncall.page_log import read_incidents, read_pages
from runwatch.oncall.records import received_time
from runwatch.prom.server import instant
from runwatch.trainer.config import TrainConfig
from tests.conftest import as_the_lab_s_alertmanager, wait_for
from tests.test_lab_e2e import NEAR_ONSET, ExtraTrainer, firing_in_prometheus

REFRESH_S = 1.0  # console.js polls the plate and the pages every second


def chart_points(tab, key: str) -> int:
    return tab.evaluate(f"() => (window.runwatchConsole.charts.{key} || {{data: [[]]}}).data[0].length")


def test_ack_in_the_browser_creates_the_silence_in_alertmanager(lab, tab):
    """A corrupt shard of its own beside the lab's run. Its TrainingLossJump fires for about 13 s
    after its page (its 30-step baseline takes that long to absorb the shuffled labels' loss):
    acked as it pages, the ack makes the silence. Its GradientNormJump may resolve within 3 s:
    the learner reads that runbook for longer than the alert fires, and acks the incident then
    (test_a_learner_reads_the_runbook_longer_than_the_alert_fires_then_acks)."""
    extra = ExtraTrainer(lab, "console-ack", *NEAR_ONSET)
    try:
        acked(lab, tab, "TrainingLossJump", extra.run_id)
        read_past_the_alert_then_acked(lab, tab, "GradientNormJump", extra.run_id)
    finally:
        extra.close()


def incident(alert: str) -> str:
    return f'li.incident[data-alert="{alert}"]'


def acked(lab, tab, alert: str, run_id: str) -> None:
    am = lab.url("alertmanager")
    tab.goto(f"{lab.url('console')}/?run={run_id}")
    button = tab.wait_for_selector(f"{incident(alert)} button.ack", timeout=90_000)
    button.click()
    assert tab.input_value("#ack-alert") == alert
    tab.fill("#ack-comment", "loss 20x and gradient norm 5x at once: bad data?")
    tab.click("#ack-submit")
    notice = tab.wait_for_selector("#notice").inner_text()
    assert f"acknowledged {alert} for run {run_id}" in notice and "; silence " in notice, notice
    silences = [
        s for s in requests.get(f"{am}/api/v2/silences", timeout=5, auth=lab.auth("alertmanager")).json()
        if {"name": "run_id", "value": run_id, "isRegex": False, "isEqual": True} in s["matchers"]
    ]  # fmt: skip
    assert len(silences) == 1 and silences[0]["status"]["state"] == "active"
    assert silences[0]["comment"] == "loss 20x and gradient norm 5x at once: bad data?"
    assert {"name": "alertname", "value": alert, "isRegex": False, "isEqual": True} in silences[0]["matchers"]
    # The incident no longer offers an ack, and shows who took it and what they said.
    tab.wait_for_selector(f"{incident(alert)} button.ack", state="detached", timeout=5000)
    row = tab.wait_for_selector(f"{incident(alert)}:not([data-state=triggered])", timeout=5000)
    assert "loss 20x and gradient norm 5x at once: bad data?" in row.query_selector(".ack-record").inner_text()


def resolved_within_s() -> float:
    """How long after its first page a corrupt shard's alert has resolved and its resolution
    reached the pager, from the configuration: the shard's steps (one a second), the longest
    window of the model alerts' expressions (TrainingLossJump's 5-step mean), one scrape and one
    evaluation (1 s each), and Alertmanager's group_interval, which sends the resolution."""
    group_interval = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())["route"]["group_interval"]
    return TrainConfig().corrupt_steps + 5 + 1 + 1 + float(group_interval.rstrip("s"))


def read_past_the_alert_then_acked(lab, tab, alert: str, run_id: str) -> None:
    """The learner opens the runbook and reads on until the alert has resolved: its incident stays
    open, unacknowledged, and takes the ack (with no silence: nothing fires to silence)."""
    tab.click(f"{incident(alert)} button.show-runbook")
    tab.wait_for_selector(f'#runbook article[data-alert="{alert}"]')
    resolution = (alert, run_id, "resolved")
    wait_for(
        lambda: [p for p in read_pages(lab.page_log) if (p["alert"], p["run_id"], p["status"]) == resolution],
        resolved_within_s(), f"{alert}'s resolution",
    )  # fmt: skip
    row = tab.wait_for_selector(f"{incident(alert)} li.page.resolved", timeout=(REFRESH_S + 2) * 1000)
    assert row.query_selector(".value-at-resolution") is not None  # what its rule measured then, not the firing value
    assert not firing_in_prometheus(lab, alert, run_id)
    row = tab.query_selector(incident(alert))
    assert row.get_attribute("data-state") == "triggered" and "its alert resolved" in row.inner_text()
    row.query_selector("button.ack").click()
    assert tab.input_value("#ack-alert") == alert
    tab.fill("#ack-comment", "read the runbook: shuffled labels, the norm spiked with the loss")
    tab.click("#ack-submit")
    notice = tab.wait_for_selector("#notice").inner_text()
    assert f"acknowledged {alert} for run {run_id}: incident resolved" in notice and "no silence" in notice
    row = tab.wait_for_selector(f'{incident(alert)}[data-state="resolved"]', timeout=(REFRESH_S + 2) * 1000)
    assert "read the runbook: shuffled labels" in row.inner_text()
    [found] = [i for i in read_incidents(lab.page_log, run_id) if i["alert"] == alert]
    resolved_at = max(received_time(p) for p in found["pages"] if p["status"] == "resolved")
    assert time_to_ack(found) > resolved_at - received_time({"received_at": found["first_page"]})


def test_the_plate_appears_and_follows_the_run(lab, tab):
    prom = lab.url("prometheus")
    wait_for(lambda: instant(prom, f'runwatch_train_step{{run_id="{lab.run_id}"}} >= 305'), 90, "step 305")
    tab.goto(f"{lab.url('console')}/?run={lab.run_id}")
    tab.wait_for_function("() => window.runwatchConsole.state.plate !== null", timeout=10_000)
    before = {key: chart_points(tab, key) for key in ("loss", "grad", "throughput")}
    assert all(n > 20 for n in before.values()), before
    # A new step is scraped every second and drawn at the next refresh: 2 s of the run, 1 of polling.
    tab.wait_for_function(
        f"() => window.runwatchConsole.charts.loss.data[0].length > {before['loss']}",
        timeout=(2 + REFRESH_S + 2) * 1000,
    )
    plate = tab.evaluate("() => window.runwatchConsole.state.plate")
    assert [s["label"] for s in plate["panels"]["loss"]["series"]][:2] == ["training loss", "held-out loss"]
    assert plate["incident"] and plate["incident"][0][0] >= 300  # the corrupt shard's window, shaded
    assert 300 <= plate["readouts"]["GradientNormJump"] <= 302
    assert "GradientNormJump 30" in tab.inner_text("#readouts")
    # No link out is a dead page: Debian's Prometheus 3 serves no web UI (its query page answers
    # 404), so the console offers no link into it (compose's upstream image has the UI: there the
    # links are offered, and tests/test_compose_e2e.py opens them).
    assert requests.get(f"{prom}/query", timeout=10).status_code == 404
    assert plate["links"] == {}
    for key in ("loss", "grad", "throughput"):
        assert not tab.is_visible(f"#link-{key}")
    assert tab.query_selector("#rules-link") is None


def forged_page(run_id: str, text: str) -> dict:
    return {
        "status": "firing", "fingerprint": f"html{time.time_ns()}", "startsAt": "2026-01-01T00:00:00Z",
        "labels": {"alertname": "HtmlInAPage", "run_id": run_id, "severity": "page"},
        "annotations": {"summary": text, "description": text},
    }  # fmt: skip


def test_a_page_shows_within_3s_of_the_pager_storing_it_and_its_html_as_text(lab, tab):
    """A page whose text holds HTML and script (any local process may post one) shows as text."""
    run_id = "e2e-console-html"
    tab.goto(f"{lab.url('console')}/?run={run_id}")
    tab.wait_for_selector("#no-pages")
    text = '<img src=x onerror="alert(1)"><b>bold</b><script>alert(2)</script>'
    resp = requests.post(f"{lab.url('pager')}/webhook", json={"alerts": [forged_page(run_id, text)]},
                         headers=as_the_lab_s_alertmanager(lab.state), timeout=5)  # fmt: skip
    assert resp.json()["stored"] == 1
    row = tab.wait_for_selector('li.page[data-alert="HtmlInAPage"]', timeout=3000)  # the bound
    assert text in row.inner_text()
    for part in (".summary", ".description"):  # the page's own text: not one element made of it
        assert row.query_selector(part).evaluate("el => el.children.length") == 0
    assert row.query_selector("img") is None and row.query_selector("script") is None


def test_a_runbook_renders_beside_the_pages(lab, tab):
    wait_for(lambda: [p for p in read_pages(lab.page_log) if p["run_id"] == lab.run_id], 90, "the incident's page")
    tab.goto(f"{lab.url('console')}/?run={lab.run_id}")
    tab.click('li.incident[data-alert="GradientNormJump"] button.show-runbook')
    article = tab.wait_for_selector('#runbook article[data-alert="GradientNormJump"]')
    assert article.query_selector("h1").inner_text() == "GradientNormJump"
    assert article.query_selector("pre code") is not None  # its PromQL, as code


def test_a_form_from_another_origin_is_refused(lab):
    console = lab.url("console")
    resp = requests.post(f"{console}/ack", data={"alert": "TrainingLossJump", "run": lab.run_id}, timeout=5)
    assert resp.status_code == 403
    resp = requests.post(
        f"{console}/ack",
        data={"alert": "X", "run": "r", "token": "guess"},
        headers={"Origin": "http://evil"},
        timeout=5,
    )
    assert resp.status_code == 403


def test_the_stability_row_and_each_curve_s_colour_are_drawn_from_the_lab_s_fp16_run(lab, tab):
    """Issue 36, item 3: in fp16, ActivationNormSpike paged, but the native console drew no loss
    scale or logit norm (Grafana's rows for them exist only in compose); and a curve's colour
    depended on the panel's other curves. The shared lab's runs are mixed precision."""
    from runwatch.readouts import colours

    tab.goto(f"{lab.url('console')}/?run={lab.run_id}")
    drawn = "(c => c.scale && c.norm && c.scale.data[0].length > 1 && c.norm.data[0].length > 1)"
    tab.wait_for_function(f"() => {drawn}(window.runwatchConsole.charts)", timeout=(2 * REFRESH_S + 8) * 1000)
    assert tab.is_visible("#panel-scale") and tab.is_visible("#panel-norm")
    strokes = "series.slice(1).map(s => [s.label, s._stroke])"
    drawn = {k: tab.evaluate(f"() => window.runwatchConsole.charts.{k}.{strokes}") for k in ("loss", "scale", "norm")}
    for key, series in drawn.items():
        for label, stroke in series:
            if colours.colour(label) is not None:
                assert stroke == colours.colour(label), (key, label, stroke)
    labels = [label for label, _ in drawn["loss"]]
    assert any(a.startswith("expected") for a in labels) and any(a.startswith("5-step mean") for a in labels), labels
    assert any(a == "alert threshold (LossScaleCollapse)" for a, _ in drawn["scale"]), drawn["scale"]

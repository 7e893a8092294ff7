"""The on-call console in a real browser (Debian's chromium, driven by Playwright) on the
worker's shared lab: `runwatch up` serves it (on the lab's own port; 9096 by default).

The curves appear and follow the run, a page shows within 3 s of the pager storing it, HTML in a
page is shown as text, the runbook renders, and Ack creates the silence in Alertmanager.
Diagnosing a drill in the browser is in test_drill_e2e.py (a drill is a lab of its own).
"""

from __future__ import annotations

import time

import requests

from runwatch.oncall.pager import read_pages
from runwatch.prom.server import instant
from tests.conftest import wait_for
from tests.test_lab_e2e import NEAR_ONSET, ExtraTrainer

REFRESH_S = 1.0  # console.js polls the plate and the pages every second


def chart_points(tab, key: str) -> int:
    return tab.evaluate(f"() => (window.runwatchConsole.charts.{key} || {{data: [[]]}}).data[0].length")


def test_ack_in_the_browser_creates_the_silence_in_alertmanager(lab, tab):
    """A corrupt shard of its own beside the lab's run, acked as it pages: its TrainingLossJump
    fires for about 13 s after its page (its 30-step baseline takes that long to absorb the
    shuffled labels' loss), while GradientNormJump may resolve within 3 s."""
    alert = "TrainingLossJump"
    extra = ExtraTrainer(lab, "console-ack", *NEAR_ONSET)
    try:
        acked(lab, tab, alert, extra.run_id)
    finally:
        extra.close()


def acked(lab, tab, alert: str, run_id: str) -> None:
    am = lab.url("alertmanager")
    tab.goto(f"{lab.url('console')}/?run={run_id}")
    button = tab.wait_for_selector(f'li.page[data-alert="{alert}"] button.ack', timeout=90_000)
    button.click()
    assert tab.input_value("#ack-alert") == alert
    tab.fill("#ack-comment", "loss 20x and gradient norm 5x at once: bad data?")
    tab.click("#ack-submit")
    assert f"acknowledged {alert} for run {run_id}" in tab.wait_for_selector("#notice").inner_text()
    silences = [
        s for s in requests.get(f"{am}/api/v2/silences", timeout=5).json()
        if {"name": "run_id", "value": run_id, "isRegex": False, "isEqual": True} in s["matchers"]
    ]  # fmt: skip
    assert len(silences) == 1 and silences[0]["status"]["state"] == "active"
    assert silences[0]["comment"] == "loss 20x and gradient norm 5x at once: bad data?"
    assert {"name": "alertname", "value": alert, "isRegex": False, "isEqual": True} in silences[0]["matchers"]
    # The page no longer offers an ack: Alertmanager holds it silenced.
    tab.wait_for_selector(f'li.page[data-alert="{alert}"] button.ack', state="detached", timeout=5000)


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
    resp = requests.post(f"{lab.url('pager')}/webhook", json={"alerts": [forged_page(run_id, text)]}, timeout=5)
    assert resp.json()["stored"] == 1
    row = tab.wait_for_selector('li.page[data-alert="HtmlInAPage"]', timeout=3000)  # the bound
    assert text in row.inner_text()
    for part in (".summary", ".description"):  # the page's own text: not one element made of it
        assert row.query_selector(part).evaluate("el => el.children.length") == 0
    assert row.query_selector("img") is None and row.query_selector("script") is None


def test_a_runbook_renders_beside_the_pages(lab, tab):
    wait_for(lambda: [p for p in read_pages(lab.page_log) if p["run_id"] == lab.run_id], 90, "the incident's page")
    tab.goto(f"{lab.url('console')}/?run={lab.run_id}")
    tab.click('li.page[data-alert="GradientNormJump"] button.show-runbook')
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

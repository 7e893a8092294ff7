"""On-call as a person works it, on labs of their own, in a real browser: the console follows a
restarted lab from its first second and no earlier lab's target pages; a learner acks an incident
a minute after its alert resolved, and the postmortem records the time to ack.

Minutes of lab time between them (two labs one after the other; a drill read for a minute past
its alert): the slow tier, `make test-slow`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import requests
import yaml

from runwatch.core.addresses import lab_url
from runwatch.core.paths import REPO
from runwatch.oncall.page_log import read_incidents, read_pages
from runwatch.prom.server import instant
from tests.conftest import LabStart, holds, runwatch, wait_for
from tests.test_console_e2e import REFRESH_S, incident, resolved_within_s
from tests.test_drill_e2e import drill
from tests.test_lab_e2e import NEAR_ONSET

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # labs of their own, started here

PAGE_WITHIN_S = 90  # a corrupt shard's first page, from a lab's start: as tests/test_console_e2e.py waits


def rule(group_file: str, alert: str) -> dict:
    groups = yaml.safe_load((REPO / "prometheus" / "rules" / group_file).read_text())["groups"]
    return next(r for g in groups for r in g["rules"] if r.get("alert") == alert)


def seconds(text: str) -> float:
    return float(text.rstrip("s"))


def test_a_lab_restarted_without_control_pages_nothing_for_its_old_target_and_its_console_follows_it(tmp_path, tab):
    """`up --control`, its control trainer dies (Prometheus scrapes it down), `down`; then `up`
    without --control in the same state directory. Prometheus keeps the old target's last `up`
    of 0 for its 5-minute lookback: TrainerDown must not page for it. The console, opened as
    soon as `up` returns, shows the new lab's run, before its first scrape, and its incident."""
    first = LabStart(tmp_path, "--control")
    try:
        lab = first.wait()
        control = lab.records()["control"]
        control_run = control["argv"][control["argv"].index("--run-id") + 1]
        address = lab.address("control")
        prom = lab.url("prometheus")
        stepped = f'runwatch_train_step{{run_id="{control_run}"}} >= 1'
        wait_for(lambda: instant(prom, stepped), 30, "the control run's first steps, scraped")
        os.kill(control["pid"], signal.SIGKILL)
        wait_for(lambda: instant(prom, f'up{{instance="{address}"}} == 0'), 10, "the control run scraped down")
    finally:
        first.stop()

    res = runwatch("up", "--root", str(tmp_path), "--state-dir", str(first.state), "--ports", "free", "--detach",
                   *NEAR_ONSET, cwd=tmp_path)  # fmt: skip
    started = time.monotonic()
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        run_id = json.loads((first.state / "lab.json").read_text())["run_id"]
        prom = lab_url(first.state, "prometheus")
        scraped = f'runwatch_train_step{{run_id="{run_id}"}}'
        before_first_scrape = not instant(prom, scraped)
        tab.goto(f"{lab_url(first.state, 'console')}/")
        assert tab.get_attribute("#console", "data-run") == run_id  # the new lab's run, not the old control's
        assert tab.eval_on_selector_all("#run-picker option", "os => os.map(o => o.value)")[0] == run_id
        if before_first_scrape:  # what the learner reads until Prometheus holds a sample
            tab.wait_for_function(
                "() => document.getElementById('run-state').textContent !== ''", timeout=(REFRESH_S + 5) * 1000
            )
            state = tab.inner_text("#run-state")
            assert state == "(waiting for the first scrape)" or instant(prom, scraped), state
        tab.wait_for_function("() => window.runwatchConsole.state.plate !== null", timeout=30_000)
        assert "running" in tab.inner_text("#run-state")
        tab.wait_for_selector(f"{incident('TrainingLossJump')}", timeout=PAGE_WITHIN_S * 1000)

        # TrainerDown's `for:`, the 5 s a target counts as scraped, and group_interval: had the old
        # target's `up` counted, it would have paged by then
        down = rule("alerts.yml", "TrainerDown")
        am = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())["route"]
        hold = seconds(down["for"]) + 5 + seconds(am["group_interval"])

        def no_trainer_down() -> bool:
            return not [p for p in read_pages(first.state / "pages.jsonl") if p["alert"] == "TrainerDown"]

        assert no_trainer_down()
        holds(no_trainer_down, max(0.0, hold - (time.monotonic() - started)), "no TrainerDown page")
        window = int(time.monotonic() - started) + 5
        # Never firing. It may go pending for the first evaluations of a Prometheus restarted within
        # 5 s of the old target's last scrape (its last `up` of 0 is that recent), never for `for:`.
        firing = f'ALERTS{{alertname="TrainerDown",alertstate="firing",instance="{address}"}}'
        ever = instant(prom, f"count_over_time({firing}[{window}s])")
        assert ever == [], ever

        # The old lab's control run, killed with no end recorded, reads as stopped, not running
        tab.goto(f"{lab_url(first.state, 'console')}/?run={control_run}")
        tab.wait_for_function("() => window.runwatchConsole.state.plate !== null", timeout=30_000)
        assert re.fullmatch(r"\(stopped at step \d+\)", tab.inner_text("#run-state")), tab.inner_text("#run-state")
    finally:
        runwatch("down", "--state-dir", str(first.state), cwd=tmp_path)


def test_a_learner_acks_a_minute_after_the_alert_resolved_and_the_postmortem_records_the_time_to_ack(
    tmp_path, lab_state, tab
):
    """The drill of seed 516 (a corrupt shard from step 247) in the browser: the learner opens the
    loss's runbook and reads it for a minute after the alert has resolved, then acks the incident
    (still open, unacknowledged), diagnoses, and writes the postmortem, which says how long after
    the first page the ack came."""
    run_id = drill(tmp_path, lab_state, 516)
    console = lab_url(lab_state, "console")
    tab.goto(f"{console}/")
    alert = "TrainingLossJump"
    tab.wait_for_selector(f"{incident(alert)} button.show-runbook", timeout=PAGE_WITHIN_S * 1000).click()
    tab.wait_for_selector(f'#runbook article[data-alert="{alert}"]')
    resolved = (alert, run_id, "resolved")
    pages = lab_state / "pages.jsonl"
    wait_for(
        lambda: [p for p in read_pages(pages) if (p["alert"], p["run_id"], p["status"]) == resolved],
        resolved_within_s(), f"{alert}'s resolution",
    )  # fmt: skip

    def still_open() -> bool:
        found = requests.get(f"{lab_url(lab_state, 'pager')}/api/incidents", params={"run_id": run_id}, timeout=5)
        return [i["state"] for i in found.json()["incidents"] if i["alert"] == alert] == ["triggered"]

    holds(still_open, 60, f"{alert}'s incident open, unacknowledged, a minute after its alert resolved")
    row = tab.wait_for_selector(f'{incident(alert)}[data-state="triggered"]')
    assert "its alert resolved" in row.inner_text()
    row.query_selector("button.ack").click()
    tab.fill("#ack-comment", "read the runbook through: shuffled labels?")
    tab.click("#ack-submit")
    notice = tab.wait_for_selector("#notice").inner_text()
    assert f"acknowledged {alert} for run {run_id}: incident resolved" in notice, notice
    tab.wait_for_selector(f'{incident(alert)}[data-state="resolved"]', timeout=(REFRESH_S + 2) * 1000)

    tab.select_option("#diagnose-incident", "corrupt_shard")
    tab.fill("#diagnose-step", "250")
    tab.click("#diagnose-submit")
    assert tab.wait_for_selector("#notice").inner_text().startswith("CORRECT")
    tab.click("#postmortem-submit")  # written, and shown
    article = tab.wait_for_selector("article.postmortem")
    grade = json.loads((lab_state / "drill.json").read_text())["grade"]
    [acked] = [i for i in read_incidents(lab_state / "pages.jsonl", run_id) if i["alert"] == alert]
    assert grade["first_page_to_ack_s"] >= 60  # a minute past the resolution, which came after the page
    said = re.search(r"first page to ack: ([0-9.]+) s", article.inner_text())
    assert said and float(said[1]) == grade["first_page_to_ack_s"], article.inner_text()
    assert f"Acknowledged {alert} by {acked['acked_by']}" in article.inner_text()
    assert "read the runbook through: shuffled labels?" in article.inner_text()

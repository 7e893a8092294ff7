"""The console's Rules page in a real browser (Debian's chromium, driven by Playwright) on a lab
of its own: a learner edits HeldOutGap, backtests the edit, applies it on a fresh copy of the
configuration with no file touched by hand, and the lab pages by the new rule; a broken
expression changes nothing.

The lab is this test's own (its copy of the configuration, its state dir, free ports): the
applied rule is never read by another test. It waits on the lab clock for the incident's onset
(about 3 minutes): the slow tier (`make test-slow`).
"""

from __future__ import annotations

import pytest
import requests
import yaml

from runwatch.backtest.signatures import SIGNATURES
from runwatch.oncall.page_log import read_pages
from runwatch.prom.server import instant
from tests.conftest import wait_for

FAST_FORWARD = 150  # the onset (300) 150 lab seconds away: time to backtest and apply before it
SWEEP_SEEDS, SWEEP_STRENGTHS = "100-101", "0.1,1"  # a backtest of 10 runs: seconds, not a minute
BROKEN = "run:runwatch_train_heldout_to_train_loss:ratio20s >> 2"


def editor_text(tab, text: str) -> None:
    """Replace the editor's text as a learner does: select all, type."""
    tab.click(".promql-editor .cm-content")
    tab.keyboard.press("Control+a")
    tab.keyboard.type(text)


@pytest.mark.slow
def test_edit_backtest_and_apply_heldoutgap_in_the_browser(lab_factory, tab):
    lab = lab_factory("--incident", "repeated_batch", "--fast-forward", str(FAST_FORWARD)).wait()
    console, prom = lab.url("console"), lab.url("prometheus")
    alerts = lab.cwd / "prometheus" / "rules" / "alerts.yml"
    shipped = alerts.read_text()
    previous = alerts.with_name("alerts.yml.previous")
    tab.set_default_timeout(300_000)  # a backtest on a loaded 2-core machine; Playwright's 30 s is less

    # --- the list: every alert with its expression, for:, threshold, severity and runbook ---
    tab.goto(f"{console}/rules")
    row = tab.locator('#rules tr[data-alert="HeldOutGap"]')
    assert row.locator(".for").inner_text() == "10s" and row.locator(".threshold").inner_text() == "2"
    assert "run:runwatch_train_heldout_to_train_loss:ratio20s" in row.locator(".expr").inner_text()
    assert row.locator(".severity").inner_text() == "page"
    row.locator("a.edit-rule").click()
    tab.wait_for_selector(".promql-editor .cm-content")

    # --- a broken expression: marked in the editor, refused with promtool's message, nothing written ---
    editor_text(tab, BROKEN)
    tab.wait_for_selector(".promql-editor .cm-lintRange-error", state="attached")
    tab.click("#apply")
    refused = tab.inner_text("#refused")
    assert "promtool check rules" in refused and "parse error" in refused, refused
    assert alerts.read_text() == shipped and not previous.exists()

    # --- the edit: a lower threshold, backtested with its sweep ---
    tab.goto(f"{console}/rules/HeldOutGap")
    tab.wait_for_selector(".promql-editor .cm-content")
    tab.fill("#threshold", "1.5")
    tab.fill("#seeds", SWEEP_SEEDS)
    tab.fill("#strengths", SWEEP_STRENGTHS)
    tab.click("#backtest")
    assert "sweep of HeldOutGap's threshold" in tab.inner_text("#trade-off-title")
    first = tab.eval_on_selector_all("#trade-off tbody tr", "rows => rows.map(r => r.cells[0].innerText)")[:2]
    assert first == ["1.5 (the edit)", "2 * in force"], first
    assert "caught/runs" in tab.locator("#backtest-output").text_content()  # the table by strength band
    assert tab.evaluate("document.querySelector('#sweep-plot').naturalWidth") > 0
    assert alerts.read_text() == shipped  # a backtest writes nothing

    # --- Apply on a fresh copy, no file touched by hand: the unit tests that pin the shipped
    # threshold are left out (runwatch.prom.edits), and the page says which ---
    tests = {f.name: f.read_text() for f in (lab.cwd / "prometheus" / "tests").glob("*.test.yml")}
    tab.click("#apply")
    applied = tab.inner_text("#applied")
    assert "reloaded prometheus" in applied, applied
    assert "left out, as they pin the values of HeldOutGap as shipped" in applied, applied
    assert {f.name: f.read_text() for f in (lab.cwd / "prometheus" / "tests").glob("*.test.yml")} == tests
    assert previous.read_text() == shipped
    written = alerts.read_text()
    assert [line for line in written.splitlines() if line.strip().startswith("#")] == [
        line for line in shipped.splitlines() if line.strip().startswith("#")
    ]
    rule = [r for g in yaml.safe_load(written)["groups"] for r in g["rules"] if r.get("labels", {}).get("alertname") ==
            "HeldOutGap" and "record" in r]  # fmt: skip
    assert rule[0]["expr"] == "vector(1.5)"
    assert tab.locator("input#threshold").input_value() == "1.5"

    # --- the lab pages by the new rule ---
    sel = 'alert:runwatch_threshold:ratio{alertname="HeldOutGap"}'
    wait_for(lambda: [float(s["value"][1]) for s in instant(prom, sel)] == [1.5], 20, "the threshold of 1.5 in force")
    [step] = instant(prom, f'runwatch_train_step{{run_id="{lab.run_id}"}}')
    # until the plate's latest HeldOutGap readout of a repeated batch, then the `for:` and a
    # group_interval of Alertmanager (alertmanager.yml) for the page to arrive
    latest = SIGNATURES["repeated_batch"]["HeldOutGap"].fires[1]
    bound = max(0, latest - float(step["value"][1])) + 10 + 5 + 5

    def paged() -> list[dict]:
        pages = read_pages(lab.state / "pages.jsonl")
        ours = [p for p in pages if p["alert"] == "HeldOutGap" and p["run_id"] == lab.run_id]
        return [p for p in ours if "vector(1.5)" in str(p.get("rule", {}).get("thresholds"))]

    found = wait_for(paged, bound, "a HeldOutGap page under the threshold of 1.5")
    assert found[0]["status"] == "firing"
    assert requests.get(f"{console}/rules", timeout=10).text.count("HeldOutGap") >= 1

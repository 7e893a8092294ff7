"""The Rules page's refusals as a learner reads them, in a real browser (Debian's chromium, driven
by Playwright), without a lab: `runwatch console` over a copy of the configuration of its own.
A refused Apply is one line saying what failed, one saying what to do next, and the checks'
output folded, never wider than the page (issue 36, item 1: it was 3,937 px of promtool).
Its Backtest compares: the trade-off table first, the edit and the rule in force marked, the
sweep through the value in force, the report folded. Apply of a threshold edit on a live lab is
test_rules_console_e2e.py."""

from __future__ import annotations

import pytest

from runwatch.console.rules import BACKTEST_TIMEOUT_S, CHECK_TIMEOUT_S
from tests.test_rules_console_e2e import BROKEN, editor_text
from tests.test_rules_console_writers import Console

pytestmark = pytest.mark.integration


@pytest.fixture
def console(tmp_path):
    one = Console(tmp_path)
    yield one
    one.stop()


def refused(tab) -> tuple[str, str]:
    """The refusal's line and its next step; the page fits its window."""
    why, next_step = tab.inner_text("#refused-why"), tab.inner_text("#refused-next")
    assert "\n" not in why.strip(), why
    wide = tab.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert wide[0] <= wide[1], f"the page is {wide[0]} px wide in a window of {wide[1]}"
    assert not tab.locator("#refused details").get_attribute("open")  # the checks' output, folded
    return why, next_step


def test_a_broken_expression_is_refused_in_one_line_with_what_to_do(console, tab):
    tab.set_default_timeout(CHECK_TIMEOUT_S * 1000)
    tab.goto(f"{console.base}/rules/HeldOutGap")
    tab.wait_for_selector(".promql-editor .cm-content")
    editor_text(tab, BROKEN)
    tab.click("#apply")
    why, next_step = refused(tab)
    assert why.startswith("Not applied (nothing was written): promtool check rules failed: alerts.yml:"), why
    assert "parse error" in why and "Fix the expression" in next_step, (why, next_step)
    assert "promtool check rules" in tab.locator("#refused pre").text_content()


def test_a_threshold_that_pages_on_healthy_runs_is_refused_by_the_two_runs_evaluation(console, tab):
    shipped = console.alerts.read_text()
    tab.set_default_timeout(CHECK_TIMEOUT_S * 1000)
    tab.goto(f"{console.base}/rules/TrainingLossJump")
    tab.wait_for_selector(".promql-editor .cm-content")
    tab.fill("#threshold", "0.5")
    tab.click("#apply")
    why, next_step = refused(tab)
    assert "promtool test rules failed: tests/two_runs.test.yml" in why, why
    assert "fires on two healthy runs" in next_step and "Backtest" in next_step, next_step
    assert console.alerts.read_text() == shipped


def test_a_backtest_compares_the_edit_with_the_rule_in_force_table_first(console, tab):
    tab.set_default_timeout(BACKTEST_TIMEOUT_S * 1000)
    tab.goto(f"{console.base}/rules/TrainingLossJump")
    tab.wait_for_selector(".promql-editor .cm-content")
    tab.fill("#threshold", "2.5")
    tab.fill("#seeds", "100-101")
    tab.fill("#strengths", "0.1,1")
    tab.click("#backtest")
    tab.wait_for_selector("#trade-off")
    rows = tab.eval_on_selector_all("#trade-off tbody tr", "rows => rows.map(r => [r.className, r.cells[0].innerText])")
    assert rows[:2] == [["edit", "2.5 (the edit)"], ["in-force", "3 * in force"]], rows
    assert ["", "3 (= in force)"] in rows, rows  # the sweep runs through the value in force
    # the table first, then the plot, then the per-seed report, folded
    top = {s: tab.eval_on_selector(s, "e => e.getBoundingClientRect().top") for s in ("#trade-off", "#sweep-plot",
                                                                                       "#backtest-detail")}  # fmt: skip
    assert top["#trade-off"] < top["#sweep-plot"] < top["#backtest-detail"], top
    assert not tab.locator("#backtest-detail").get_attribute("open")
    assert "caught/runs" in tab.locator("#backtest-output").text_content()  # the report by strength band, kept

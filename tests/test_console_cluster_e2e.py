"""The console's cluster row over time, in a real browser (Debian's chromium, driven by
Playwright), on a lab of its own: two ranks, one of them a straggler (issue 36, item 3: the rank
table was a snapshot, with no history and no highlight of the odd rank). Each rank's step time
and collective wait is drawn over time, and the rank a firing alert names is drawn in red.

The lab waits on the lab clock for the straggler's onset and its alert (about a minute): the
slow tier (`make test-slow`).
"""

from __future__ import annotations

import time

import pytest

from runwatch.backtest.signatures import CLUSTER_SIGNATURES
from runwatch.prom.server import instant
from tests.conftest import wait_for
from tests.test_console_e2e import REFRESH_S

FAST_FORWARD = 285  # the onset (300) 15 lab seconds away
LATEST = CLUSTER_SIGNATURES["straggler"]["StragglerRank"].fires[1]  # the step it names its rank by, at the latest
STEP_S = 1.43  # a straggling job's step, in lab seconds (signatures.py)
ODD = "#d62728"  # console.js's ODD_COLOUR: a rank that a firing alert names
ALERT_AFTER_S = 5 + 1 + 1  # StragglerRank's `for:` (5s, cluster.yml), a scrape and an evaluation


def lab_pace(prom: str, run_id: str, steps: int = 3) -> tuple[int, float]:
    """(the run's step now, wall seconds per lab second): a loaded machine slows the lab's clock,
    and the bounds below follow it rather than guess."""
    sel = f'runwatch_train_step{{run_id="{run_id}"}}'

    def step() -> int | None:
        found = instant(prom, sel)
        return int(float(found[0]["value"][1])) if found else None

    first = wait_for(step, 60, "the run's first scrape")  # a scrape a second; a minute on a loaded machine
    t0 = time.monotonic()
    now = wait_for(lambda: (s := step()) is not None and s >= first + steps and s, 60 * steps, "three steps")
    return now, (time.monotonic() - t0) / (now - first)


@pytest.mark.slow
def test_each_rank_is_drawn_over_time_and_the_one_an_alert_names_in_red(lab_factory, tab):
    lab = lab_factory("--ranks", "2", "--incident", "straggler", "--fast-forward", str(FAST_FORWARD)).wait()
    prom = lab.url("prometheus")
    named = f'ALERTS{{alertstate="firing",alertname="StragglerRank",run_id="{lab.run_id}"}}'
    step, pace = lab_pace(prom, lab.run_id)
    bound = (max(0, LATEST - step) * STEP_S + ALERT_AFTER_S) * max(1.0, pace)
    found = wait_for(lambda: instant(prom, named), bound, "StragglerRank naming a rank")
    odd = found[0]["metric"]["rank"]
    tab.goto(f"{lab.url('console')}/?run={lab.run_id}")
    ready = "(c => c.steptime && c.wait && c.steptime.data[0].length > 10)"
    tab.wait_for_function(f"() => {ready}(window.runwatchConsole.charts)", timeout=(3 * REFRESH_S + 10) * 1000)
    for key in ("steptime", "wait"):
        drawn = tab.evaluate(
            f"() => window.runwatchConsole.charts.{key}.series.slice(1).map(s => [s.label, s._stroke])"
        )
        assert sorted(label for label, _ in drawn) == ["rank 0", "rank 1"], drawn
        assert {label: stroke == ODD for label, stroke in drawn} == {f"rank {r}": str(r) == odd for r in (0, 1)}

    # the heat strip: a row a rank, the odd rank's compute time red beside the fastest's, white
    heat = "document.getElementById('heat-compute')"
    rows = tab.evaluate(f"() => {heat}.height / 14")  # console.js's HEAT_ROW
    assert rows == 2, rows
    green = tab.evaluate(f"""() => {{ const c = {heat}, ctx = c.getContext('2d');
        return [0, 1].map(r => ctx.getImageData(c.width - 2, r * 14 + 7, 1, 1).data[1]); }}""")
    assert green[int(odd)] < 230 and green[1 - int(odd)] > 245, green  # red has less green

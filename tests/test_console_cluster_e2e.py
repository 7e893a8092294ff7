"""The console's cluster row over time, in a real browser (Debian's chromium, driven by
Playwright), on a lab of its own: two ranks, one of them a straggler (issue 36, item 3: the rank
table was a snapshot, with no history and no highlight of the odd rank). Each rank's step time
and collective wait is drawn over time, and the rank a firing alert names is drawn in red.

The lab waits on the lab clock for the straggler's onset and its alert (about a minute): the
slow tier (`make test-slow`).
"""

from __future__ import annotations

import pytest

from runwatch.backtest.signatures import CLUSTER_SIGNATURES
from runwatch.prom.server import instant
from tests.conftest import wait_for
from tests.test_console_e2e import REFRESH_S

FAST_FORWARD = 285  # the onset (300) 15 lab seconds away
LATEST = CLUSTER_SIGNATURES["straggler"]["StragglerRank"].fires[1]  # the step it names its rank by, at the latest
STEP_S = 1.43  # a straggling job's step, in lab seconds (signatures.py)
ODD = "#d62728"  # console.js's ODD_COLOUR: a rank that a firing alert names
# StragglerRank's latest readout, in lab seconds from here, then its `for:` (5s, cluster.yml), a
# scrape and an evaluation (1 s each)
BOUND_S = (LATEST - FAST_FORWARD) * STEP_S + 5 + 1 + 1


@pytest.mark.slow
def test_each_rank_is_drawn_over_time_and_the_one_an_alert_names_in_red(lab_factory, tab):
    lab = lab_factory("--ranks", "2", "--incident", "straggler", "--fast-forward", str(FAST_FORWARD)).wait()
    prom = lab.url("prometheus")
    named = f'ALERTS{{alertstate="firing",alertname="StragglerRank",run_id="{lab.run_id}"}}'
    found = wait_for(lambda: instant(prom, named), BOUND_S, "StragglerRank naming a rank")
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

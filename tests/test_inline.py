"""Recording rules inlined as subqueries: which references are found, and which are left recorded.

That an inlined rule reads exactly what its backfilled series would is tested against a real
Prometheus in tests/test_backtest.py; this file checks the rewriting itself.
"""

import pytest

from runwatch.backtest.inline import Inliner, references

RULES = {"r:loss:avg5s": "avg_over_time(loss[5s])", "r:loss:ratio": "r:loss:avg5s / avg_over_time(loss[30s])"}


def found(expr: str) -> list[tuple]:
    return [(r.name, r.range, r.offset, r.exact, expr[r.start : r.end]) for r in references(expr)]


def test_metric_names_are_found_and_the_rest_is_not():
    expr = 'sum by (r:loss:avg5s) (r:loss:avg5s) + label_replace(x, "r:loss:avg5s", "$1", "b", "(.*)") # r:loss:avg5s'
    assert found(expr) == [("r:loss:avg5s", None, None, True, "r:loss:avg5s"), ("x", None, None, True, "x")]
    assert found("a > bool 1e3 and on (job) group_left b offset 5m") == [
        ("a", None, None, True, "a"),
        ("b", None, "5m", True, "b offset 5m"),
    ]


@pytest.mark.parametrize(
    "expr, want",
    [
        ("r:x[20s]", ("20s", None, True, "r:x[20s]")),
        ("rate(r:x [ 30s ] offset -5s)", ("30s", "-5s", True, "r:x [ 30s ] offset -5s")),
        ('r:x{job="trainer"}', (None, None, False, 'r:x{job="trainer"}')),
        ('r:x{job=~"t.*"}', (None, None, False, "r:x")),
        ("r:x @ 1767225600", (None, None, False, "r:x")),
        ("r:x[5m:1m]", (None, None, False, "r:x")),
    ],
)  # fmt: skip
def test_what_follows_a_name_decides_whether_it_can_be_rewritten(expr, want):
    assert found(expr)[0][1:] == want


def test_a_reference_becomes_the_subquery_a_backfill_would_have_recorded():
    inliner = Inliner(RULES, lookback="3s", since=100.0)
    assert inliner.inline("r:loss:avg5s > 3") == "last_over_time((avg_over_time(loss[5s]))[3s:1s]) > 3"
    assert inliner.inline("avg_over_time(r:loss:avg5s[20s] offset 5s)") == (
        "avg_over_time((avg_over_time(loss[5s]))[20s:1s] offset 5s)"
    )
    assert inliner.inline("r:loss:avg5s offset 5s") == ("last_over_time((avg_over_time(loss[5s]))[3s:1s] offset 5s)")
    # a rule that reads another is inlined whole, each level on the same grid
    assert inliner.inline("r:loss:ratio > 2") == (
        "last_over_time((last_over_time((avg_over_time(loss[5s]))[3s:1s]) / avg_over_time(loss[30s]))[3s:1s]) > 2"
    )


def test_the_guard_is_kept_where_an_expression_has_values_without_data():
    inliner = Inliner({"r:gone": "absent(up)"}, lookback="3s", since=100.0)
    assert inliner.inline("r:gone == 1") == (
        "last_over_time(((absent(up)) and on() (vector(time()) >= 100.0))[3s:1s]) == 1"
    )
    assert inliner.guarded("x offset -5s") == "(x offset -5s) and on() (vector(time()) >= 100.0)"
    assert inliner.guarded("rate(x[1m])") == "rate(x[1m])"


def test_what_cannot_be_inlined_exactly_stays_recorded():
    inliner = Inliner(RULES, lookback="3s", since=0.0)
    assert inliner.inlinable(["r:loss:ratio > 2"]) == set(RULES)
    # matchers on a recorded series: that one is backfilled; what it reads is still inlined
    assert inliner.inlinable(['r:loss:avg5s{job="t"} > 2']) == {"r:loss:ratio"}
    assert inliner.inlinable(["r:loss:ratio > 2"], labelled={"r:loss:ratio"}) == {"r:loss:avg5s"}
    assert inliner.inlinable(['{__name__="r:loss:avg5s"} > 2']) == set()
    cycle = Inliner({"r:a": "r:b + 1", "r:b": "r:a - 1", "r:c": "x"}, lookback="3s", since=0.0)
    assert cycle.inlinable(["r:a > 0", "r:c > 0"]) == {"r:c"}


LABELLED = {"t:threshold:ratio": [({"alertname": "A"}, "vector(3)"), ({"alertname": "B"}, "vector(0.8)")]}


def test_a_rule_picked_by_the_labels_it_sets_is_inlined_with_them():
    """alerts.yml's thresholds: one name, one rule per alert, each told apart by `labels:`."""
    inliner = Inliner(RULES, lookback="3s", since=100.0, labelled=LABELLED)
    expr = 'r:loss:avg5s > scalar(t:threshold:ratio{alertname="B"})'
    assert inliner.inlinable([expr]) == {*RULES, "t:threshold:ratio"}
    assert inliner.inline(expr) == (
        "last_over_time((avg_over_time(loss[5s]))[3s:1s]) > scalar(last_over_time(("
        '(label_replace(vector(0.8), "alertname", "B", "", "")) and on() (vector(time()) >= 100.0))[3s:1s]))'
    )


@pytest.mark.parametrize(
    "selector",
    [
        "t:threshold:ratio",  # every rule of the name: not one subquery
        't:threshold:ratio{alertname=~"A|B"}',  # a regex: which rules match is Prometheus's to say
        't:threshold:ratio{alertname="C"}',  # no rule sets it
        't:threshold:ratio{job="x"}',  # a label the rules do not set: their expressions decide it
    ],
)
def test_a_labelled_rule_that_no_reference_picks_exactly_stays_recorded(selector):
    inliner = Inliner(RULES, lookback="3s", since=100.0, labelled=LABELLED)
    assert inliner.inlinable([f"r:loss:avg5s > scalar({selector})"]) == set(RULES)


def test_a_reader_that_sees_a_recording_late_reads_it_a_second_further_back():
    """`lag` (the live lab's order of rule groups after a scrape) moves each form's offset by 1 s."""
    inliner = Inliner({"r:x:avg5s": "avg_over_time(x[5s])"}, "3s", 0.0, lag=lambda reader, name: reader == "late")
    body = "(avg_over_time(x[5s]))"
    assert inliner.inline("r:x:avg5s > 3", reader="late") == f"last_over_time({body}[3s:1s] offset 1000ms) > 3"
    assert inliner.inline("r:x:avg5s offset 5s", reader="late") == f"last_over_time({body}[3s:1s] offset 6000ms)"
    assert inliner.inline("r:x:avg5s[20s] offset 1m", reader="late") == f"{body}[20s:1s] offset 61000ms"
    assert inliner.inline("r:x:avg5s offset -2s", reader="late") == f"last_over_time({body}[3s:1s] offset -1000ms)"
    assert inliner.inline("r:x:avg5s > 3", reader="fresh") == f"last_over_time({body}[3s:1s]) > 3"


def test_a_recording_read_late_inside_a_recording_is_read_late_where_it_is_inlined():
    """The lag of a recording read by another recording is that reader's, wherever it is inlined."""
    rules = {"r:a": "x", "r:b": "r:a * 2"}
    inliner = Inliner(rules, "3s", 0.0, lag=lambda reader, name: int(reader == "r:b" and name == "r:a"))
    inner = "last_over_time((x)[3s:1s] offset 1000ms)"
    assert inliner.inline("r:b", reader="alert") == f"last_over_time(({inner} * 2)[3s:1s])"

"""One home for a Prometheus duration (runwatch/core/durations.py): Prometheus's grammar, a
one-line error naming where bad text came from, every reader of a duration using it, and a test
that fails on a second parser.

Each reader here once had a parser of its own, and each was wrong in its own way: the backtest's
gave NaN, the console's truncated and took "1s1s", the drill's ignored d, w and y, the sweep's
took "1m1m" as two minutes.
"""

from __future__ import annotations

import re

import pytest

from runwatch.core.paths import REPO

GOOD = {
    "0": 0, "0s": 0, "10s": 10_000, "1m30s": 90_000, "1h30m": 5_400_000, "500ms": 500, "1s500ms": 1_500,
    "2d": 172_800_000, "1w": 604_800_000, "1y": 31_536_000_000,
    "1y2w3d4h5m6s7ms": ((((365 + 14 + 3) * 24 + 4) * 60 + 5) * 60 + 6) * 1000 + 7,
}  # fmt: skip


@pytest.mark.parametrize("text, ms", GOOD.items(), ids=GOOD.keys())
def test_prometheus_s_grammar_is_read(text, ms):
    from runwatch.core.durations import duration_ms, duration_seconds

    assert duration_ms(text) == ms and duration_seconds(text) == ms / 1000


def test_an_offset_keeps_its_sign():
    from runwatch.core.durations import duration_ms

    assert duration_ms("-5m") == -300_000


BAD = {
    "empty": "", "a bare number": "90", "a fraction": "1.5s", "a unit twice": "1s1s", "smallest first": "30s1m",
    "a space": "5 m", "an unknown unit": "1x", "no number": "ms", "a sign alone": "-", "a minus inside": "1h-5m",
    "upper case": "10S",
}  # fmt: skip


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_bad_text_is_one_line_naming_where_it_came_from(text):
    from runwatch.core.command import UsageError
    from runwatch.core.durations import DurationError, duration_seconds

    with pytest.raises(DurationError) as err:
        duration_seconds(text, "--sweep")
    message = str(err.value)
    assert isinstance(err.value, UsageError) and isinstance(err.value, ValueError)
    assert message.startswith(f"--sweep: {text!r} is not a Prometheus duration") and "\n" not in message


# --- every reader uses it: each of these was read wrong by a parser of its own ---


def test_the_sweep_refuses_a_unit_given_twice():
    """`--sweep A.for=1m1m` was two minutes; Prometheus refuses it."""
    from runwatch.backtest.variants import parse_sweep
    from runwatch.core.command import UsageError

    with pytest.raises(UsageError, match=r"^--sweep: '1m1m' is not a Prometheus duration"):
        parse_sweep("HeldOutGap.for=10s,1m1m")
    assert parse_sweep("HeldOutGap.for=1m30s").values == ("1m30s",)


def test_the_console_refuses_a_for_prometheus_would_refuse():
    """The Rules page took `for: 1s1s`, which promtool then refused at Apply."""
    from runwatch.console.rules import FOR_STEPS_S, Alert, Edit, EditError

    alert = Alert("A", REPO / "prometheus" / "rules" / "alerts.yml", "g", "x > 1", "10s", "page", "", None)
    with pytest.raises(EditError, match=r"^for: a duration such as 10s or 1m"):
        Edit.of(alert, {"expr": "x > 1", "for": "1s1s"})
    assert Edit.of(alert, {"expr": "x > 1", "for": "1d"}).hold == "1d"
    # around the edited value, and the value in force (10s), which every sweep includes (issue 36)
    assert Edit.of(alert, {"expr": "x > 1", "for": "1d"}).sweep() == "A.for=" + ",".join(
        f"{v}s" for v in sorted({86400 + d for d in FOR_STEPS_S} | {10})
    )


def test_the_drill_reads_days_in_alertmanager_s_routes_and_names_a_bad_one(tmp_path):
    """The drill's window ignored d, w and y (1d was 0 s), and anything it could not read."""
    from runwatch.core.command import UsageError
    from runwatch.drill.confirm import RESEND_DELAY_S, notification_window_s

    am = tmp_path / "am.yml"
    am.write_text("route:\n  receiver: x\n  group_wait: 1d\n  group_interval: 1w\n")
    assert notification_window_s(am) == 86400 + 604800 + RESEND_DELAY_S
    am.write_text("route:\n  receiver: x\n  group_wait: 5x\n")
    with pytest.raises(UsageError, match=rf"^{re.escape(str(am))}: route's group_wait: '5x' is not a Prometheus"):
        notification_window_s(am)


def test_the_backtest_names_an_alert_whose_for_it_cannot_read():
    from runwatch.backtest.plan import firing_query
    from runwatch.core.command import UsageError

    assert firing_query("x > 1", {"alert": "A", "for": "1m"}).startswith("count_over_time((x > 1)[60500ms:1s])")
    with pytest.raises(UsageError, match=r"^--rules: for: of alert A: '1s1s' is not a Prometheus duration"):
        firing_query("x > 1", {"alert": "A", "for": "1s1s"})


def test_a_panel_interval_of_a_day_is_read():
    from runwatch.readouts.dashboard_queries import seconds

    assert seconds("1d") == 86400 and seconds("15s") == 15


# A table from a unit to its size, the mark of a parser: "ms": 0.001, 's': 1000, "h": 3600 ...
UNIT_TABLE = re.compile(r"""["'](?:ms|s|m|h|d|w|y)["']\s*:\s*[\d_.]+""")


def test_there_is_one_parser_of_a_duration():
    """Anywhere but runwatch/core/durations.py, a table of unit sizes is a second parser."""
    folders = ("runwatch", "trainer", "exporter", "oncall", "console", "grafana", "prometheus", "benchmarks")
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for folder in folders
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != REPO / "runwatch" / "core" / "durations.py"
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if UNIT_TABLE.search(line)
    ]
    assert not found, f"a second duration parser: {found}; use runwatch.core.durations"

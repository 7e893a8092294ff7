"""The static checks of the lab's YAML, run with the real promtool and amtool: `runwatch check`
prints them, `runwatch reload` refuses an edit that fails one.

promtool's output is kept once: a line it repeats (one parse error is reported again for every
rule file a config loads and every test group) is yielded the first time only, and the unit
tests are skipped while the rules do not load.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runwatch.core.paths import Layout
from runwatch.prom.tools import binary, run_tool


@dataclass
class Check:
    name: str
    argv: list[str]
    files: list[Path]


def checks(layout: Layout) -> list[Check]:
    promtool, amtool = binary("promtool"), binary("amtool")
    rules, tests = layout.rule_files(), layout.rule_tests()
    return [
        Check("promtool check rules", [promtool, "check", "rules", *map(str, rules)], rules),
        Check(
            "promtool check config", [promtool, "check", "config", str(layout.prometheus_yml)], [layout.prometheus_yml]
        ),
        Check(TEST_RULES, [promtool, "test", "rules", *map(str, tests)], tests),
        Check("amtool check-config", [amtool, "check-config", str(layout.alertmanager_yml)], [layout.alertmanager_yml]),
    ]


TEST_RULES = "promtool test rules"
# The checkout's prometheus/targets/ is empty on purpose: `runwatch up` and compose provide the
# target files, so promtool's warning that they are missing says nothing about an edit.
MISSING_TARGETS = re.compile(r'WARNING: file "[^"]*targets/[^"]*" for file_sd in .* does not exist')
STRUCTURE = re.compile(r"(Checking |Unit Testing: |FAILED:|SUCCESS)")


def run_check(check: Check, cwd: Path) -> tuple[bool, str]:
    proc = run_tool(check.argv, cwd=cwd)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def run_all(layout: Layout) -> Iterator[tuple[Check, bool | None, list[str]]]:
    """Each check in turn: (check, passed or None if skipped, the lines of its output worth reading).

    Blank lines, the missing-targets warnings and every line already shown by an earlier check
    (or earlier in this one) are left out; promtool's headings stay, so each error keeps its file.
    """
    shown: set[str] = set()
    rules_load = True
    for check in checks(layout):
        if check.name == TEST_RULES and not rules_load:
            yield check, None, ["skipped: the rules do not load (above)"]
            continue
        ok, output = run_check(check, layout.root)
        rules_load = rules_load and (ok or check.name != "promtool check rules")
        lines, repeated = [], 0
        for line in output.splitlines():
            text = line.strip()
            if not text or MISSING_TARGETS.search(text):
                continue
            if text in shown and not STRUCTURE.match(text):
                repeated += 1
                continue
            shown.add(text)
            lines.append(line)
        if repeated:
            lines.append(f"({repeated} line{'s' * (repeated > 1)} shown above, not repeated)")
        yield check, ok, lines


# --- after a reload: what only a running Prometheus can say ---

# The evaluations of each rule group watched after a reload, in intervals of the slowest group:
# its first ones must complete, each within its interval, and no group may miss an iteration.
OBSERVED_INTERVALS = 3
MISSED = "prometheus_rule_group_iterations_missed_total"


def _seconds(rfc3339: str) -> float:
    """Prometheus's lastEvaluation (RFC 3339 with nanoseconds) as a Unix time; 0 for never."""
    from datetime import datetime

    head, _, rest = rfc3339.rstrip("Z").partition(".")
    frac = "".join(c for c in rest if c.isdigit())[:6]
    when = datetime.fromisoformat(head + (f".{frac}" if frac else "") + "+00:00")
    return 0.0 if when.year < 1970 else when.timestamp()


def evaluation_problems(prometheus: str, since: float) -> list[str]:
    """What Prometheus's own rule-group health says of the rules in force since `since` (a
    reload), once OBSERVED_INTERVALS intervals of the slowest group have passed: each group
    whose evaluations do not complete in time or that missed iterations, and each rule whose
    evaluation fails, one line each. Empty: the rules evaluate as they should.

    Decided from `/api/v1/rules` (each group's lastEvaluation, evaluationTime and interval, each
    rule's health and lastError) and Prometheus's prometheus_rule_group_iterations_missed_total,
    never by guessing a time: a group's evaluation must fit in its own interval.

        >>> evaluation_problems("http://127.0.0.1:9090", since=time.time())
        ['group slow: no evaluation completed within 3 intervals (3s) of the reload']
    """
    import time  # here: `runwatch check` needs neither

    import requests

    def groups() -> list[dict]:
        return requests.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]

    def missed() -> dict[str, float]:
        """Iterations missed so far, by group name (its label is `file;group`)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = requests.get(f"{prometheus}/metrics", timeout=10).text
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == MISSED:
                    group = sample.labels.get("rule_group", "").rsplit(";", 1)[-1]
                    found[group] = found.get(group, 0.0) + sample.value
        return found

    before = missed()
    slowest = max((float(g.get("interval", 1)) for g in groups()), default=1.0)
    time.sleep(max(0.0, since + OBSERVED_INTERVALS * slowest + 0.5 - time.time()))
    after, now_missed = groups(), missed()
    problems = []
    for g in after:
        name, interval = g["name"], float(g.get("interval", 1))
        if _seconds(g.get("lastEvaluation", "")) < since:
            problems.append(f"group {name}: no evaluation completed within {OBSERVED_INTERVALS} intervals "
                            f"({OBSERVED_INTERVALS * slowest:g}s) of the reload")  # fmt: skip
        elif float(g.get("evaluationTime", 0)) > interval:
            problems.append(f"group {name}: an evaluation took {float(g['evaluationTime']):.2f}s, "
                            f"longer than its interval of {interval:g}s")  # fmt: skip
        lost = now_missed.get(name, 0.0) - before.get(name, 0.0)
        if lost > 0:
            problems.append(f"group {name}: missed {lost:g} iterations since the reload")
        problems += [f"{r['name']} (group {name}): {r.get('lastError', '')}" for r in g["rules"]
                     if r.get("health") == "err"]  # fmt: skip
    return problems

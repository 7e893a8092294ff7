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

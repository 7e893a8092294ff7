"""`runwatch check`: every static check a learner needs after editing the lab's YAML.

    $ runwatch check
    ok    promtool check rules    prometheus/rules/alerts.yml prometheus/rules/baselines.yml
    ok    promtool check config   prometheus/prometheus.yml
    FAIL  promtool test rules     prometheus/tests/alerts.test.yml ...
          <promtool's own output, naming the file and the failing case>

Exits 1 if any check fails. It checks files only; `runwatch reload` applies them to a running lab.
promtool's output is shown once: a line it repeats (one parse error is reported again for
every rule file a config loads and every test group) is printed the first time only, and the
unit tests are skipped while the rules do not load.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from runwatch.command import Command
from runwatch.paths import Layout, binary, run_tool


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


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("--root", type=Path, default=None, help="configuration to check (default: as printed first)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the tools' output for passing checks too")
    return run


def run(args: argparse.Namespace) -> int:
    layout = Layout(args.root)
    print(f"configuration: {layout.root} ({layout.found_in})")
    failed = 0
    for check, ok, lines in run_all(layout):
        names = " ".join(
            str(f.relative_to(layout.root)) if f.is_relative_to(layout.root) else str(f) for f in check.files
        )
        print(f"{'skip' if ok is None else 'ok  ' if ok else 'FAIL'}  {check.name:22s}  {names}")
        if lines and (not ok or args.verbose):
            print("\n".join("      " + line for line in lines))
        failed += not ok
    sys.stdout.flush()
    return 1 if failed else 0

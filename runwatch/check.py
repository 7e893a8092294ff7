"""`runwatch check`: every static check a learner needs after editing the lab's YAML.

    $ runwatch check
    ok    promtool check config   prometheus/prometheus.yml
    ok    promtool check rules    prometheus/rules/alerts.yml prometheus/rules/baselines.yml
    FAIL  promtool test rules     prometheus/tests/alerts.test.yml ...
          <promtool's own output, naming the file and the failing case>

Exits 1 if any check fails. It checks files only; `runwatch reload` applies them to a running lab.
"""

from __future__ import annotations

import argparse
import sys
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
        Check(
            "promtool check config", [promtool, "check", "config", str(layout.prometheus_yml)], [layout.prometheus_yml]
        ),
        Check("promtool check rules", [promtool, "check", "rules", *map(str, rules)], rules),
        Check("promtool test rules", [promtool, "test", "rules", *map(str, tests)], tests),
        Check("amtool check-config", [amtool, "check-config", str(layout.alertmanager_yml)], [layout.alertmanager_yml]),
    ]


def run_check(check: Check, cwd: Path) -> tuple[bool, str]:
    proc = run_tool(check.argv, cwd=cwd)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("--root", type=Path, default=None, help="configuration to check (default: as printed first)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the tools' output for passing checks too")
    return run


def run(args: argparse.Namespace) -> int:
    layout = Layout(args.root)
    print(f"configuration: {layout.root} ({layout.found_in})")
    failed = 0
    for check in checks(layout):
        ok, output = run_check(check, layout.root)
        names = " ".join(
            str(f.relative_to(layout.root)) if f.is_relative_to(layout.root) else str(f) for f in check.files
        )
        print(f"{'ok  ' if ok else 'FAIL'}  {check.name:22s}  {names}")
        if output and (not ok or args.verbose):
            print("\n".join("      " + line for line in output.splitlines()))
        failed += not ok
    sys.stdout.flush()
    return 1 if failed else 0

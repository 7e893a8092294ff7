"""`runwatch check`: every static check a learner needs after editing the lab's YAML.

    $ runwatch check
    configuration: /home/me/runwatch (the current directory)
    prometheus    3.5.3+ds1    /home/me/.cache/runwatch/bin/prometheus
    ...
    ok    promtool check rules    prometheus/rules/alerts.yml prometheus/rules/baselines.yml
    ok    promtool check config   prometheus/prometheus.yml
    FAIL  promtool test rules     prometheus/tests/alerts.test.yml ...
          prometheus/tests/alerts.test.yml: HeldOutGap at 1m29s: {...}: annotation step: exp '88', got '89'
          promtool's output:
          <promtool's own output, every label of exp and got>

With --edit-of DIR, the rules are checked as a learner's edit of the rules in DIR (as `runwatch
reload` checks an edit of the rules in force, and the console's Apply): the unit-test groups
that name an alert the edit changed are left out, since they pin its values as shipped, and
the report names them (runwatch.prom.edits). Without it, every group runs: the repository's
rules are checked strictly.

Each binary is named with its version (a Prometheus older than 3 is refused: the rules are written
for 3.x). Exits 1 if any check fails. It checks files only; `runwatch reload` applies them to a running lab.
promtool's output is shown once: a line it repeats (one parse error is reported again for
every rule file a config loads and every test group) is printed the first time only, and the
unit tests are skipped while the rules do not load.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from runwatch.core.command import Command, UsageError
from runwatch.core.paths import Layout
from runwatch.prom.checks import TEST_RULES, run_all
from runwatch.prom.edits import check_edit
from runwatch.prom.tools import BINARIES, binary, version


def add_arguments(p: argparse.ArgumentParser) -> Command:
    p.add_argument("--root", type=Path, default=None, help="configuration to check (default: as printed first)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the tools' output for passing checks too")
    p.add_argument(
        "--edit-of", type=Path, default=None, metavar="RULES_DIR",
        help="check the rules as a learner's edit of the rules in RULES_DIR: the unit tests that pin the values "
        "the edit changed are left out (default: every unit test, as shipped)",
    )  # fmt: skip
    return run


def run(args: argparse.Namespace) -> int:
    layout = Layout(args.root)
    if args.edit_of is not None and not args.edit_of.is_dir():
        raise UsageError(f"--edit-of: {args.edit_of} is not a folder of rule files")
    unit_tests = None if args.edit_of is None else functools.partial(check_edit, in_force=args.edit_of)
    print(f"configuration: {layout.root} ({layout.found_in})")
    for name in BINARIES:  # the lab's binaries: the checks run two, `up` and the backtest the others
        path = binary(name)
        print(f"{name:13s} {version(path):12s} {path}")
    failed = 0
    for check, ok, lines in run_all(layout, unit_tests):
        names = " ".join(
            str(f.relative_to(layout.root)) if f.is_relative_to(layout.root) else str(f) for f in check.files
        )
        print(f"{'skip' if ok is None else 'ok  ' if ok else 'FAIL'}  {check.name:22s}  {names}")
        edit_s = unit_tests is not None and check.name == TEST_RULES  # an edit's: what was left out, and why
        if lines and (not ok or args.verbose or edit_s):
            print("\n".join("      " + line for line in lines))
        failed += not ok
    sys.stdout.flush()
    return 1 if failed else 0

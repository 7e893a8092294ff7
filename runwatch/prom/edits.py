"""A learner's edit of the rules, checked by what the edit leaves true.

The promtool unit tests (prometheus/tests/) are worked out by hand for the rules as shipped:
each test group is one scenario, and its boundaries (the step a ratio crosses 3, the second a
`for: 10s` ends) hold for the shipped values only. Move TrainingLossJump's threshold to 2.5 and
its groups fail, though nothing is wrong with the edit: they pin the number the learner meant
to change. Re-deriving them for the new value is what the backtest does, over a hundred runs.

So an edit of the rules in force (`runwatch reload`, the console's Apply, and `runwatch check
--edit-of DIR`) is checked by:

- promtool check rules and config, and amtool (run_all, as for the repository);
- every test group that names no alert the edit changed (an alert whose rule or threshold
  recording differs from the rules in force), run on the edited rules. The two-runs evaluation
  is one of them: every rule over two healthy runs of every exported series must evaluate, and
  no alert may fire;
- a group that names a changed alert is left out, and the report says which;
- a group that fails on the rules in force as well is left out too: an earlier edit changed
  what it tests (the console applied TrainingLossJump at 2.5, then HeldOutGap at 1.5).

`runwatch check` without --edit-of checks the repository as shipped: every group.

    >>> ok, lines = check_edit(Layout(), in_force=Path("state/prometheus/rules"))
"""

from __future__ import annotations

import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from runwatch.core.names import THRESHOLD
from runwatch.core.paths import Layout
from runwatch.prom.checks import test_failures
from runwatch.prom.tools import binary, run_tool

# prometheus/tests/make_two_runs_test.py's: reported first when it fails, as it says most plainly
# what is wrong with an edit (an alert that pages on healthy runs)
TWO_RUNS = "two_runs.test.yml"


class _Loader(yaml.SafeLoader):
    """YAML as promtool (Go's yaml) reads a test file: `values: 0x100` is a series of one
    hundred zeros, not the hex integer 256 of YAML 1.1. Only decimal integers are integers."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))


@dataclass
class Group:
    """One test group of one test file, written out alone."""

    source: Path  # the test file it is in
    index: int  # its place there, from 1
    title: str
    named: set[str]  # the alerts its cases and its expressions name

    @property
    def where(self) -> str:
        return f"{self.source.name} group {self.index}" + (f" ({self.title})" if self.title else "")


def alert_rules(rules_dir: Path) -> dict[str, str]:
    """Each alert's rule and its threshold recording, as text to compare: alert -> its YAML."""
    found: dict[str, list] = {}
    for path in sorted(rules_dir.glob("*.yml")):
        doc = yaml.safe_load(path.read_text()) or {}
        for group in doc.get("groups") or []:
            for rule in group.get("rules") or []:
                name = rule.get("alert") or (rule.get("labels") or {}).get("alertname")
                if name and (rule.get("alert") or rule.get("record") == THRESHOLD):
                    found.setdefault(str(name), []).append(rule)
    return {name: yaml.safe_dump(rules, sort_keys=True) for name, rules in found.items()}


def changed_alerts(in_force: Path, edited: Path) -> set[str]:
    """The alerts whose rule or threshold differs between two rules folders (added and removed ones too)."""
    before, after = alert_rules(in_force), alert_rules(edited)
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def _named(group: dict, alerts: set[str]) -> set[str]:
    text = yaml.safe_dump({k: v for k, v in group.items() if k != "input_series"})
    return {a for a in alerts if re.search(rf"(?<![\w:]){re.escape(a)}(?![\w])", text)}


def groups(layout: Layout, alerts: set[str]) -> list[tuple[Group, dict]]:
    """Every test group of the layout's test files: (the group, a test file's document holding
    it alone, its rule files named by their file names only)."""
    found = []
    for test_file in layout.rule_tests():
        doc = yaml.load(test_file.read_text(), Loader=_Loader) or {}  # noqa: S506 (a SafeLoader)
        for i, group in enumerate(doc.get("tests") or [], 1):
            head = {k: v for k, v in doc.items() if k not in ("tests", "rule_files")}
            names = [Path(f).name for f in doc.get("rule_files") or []]
            found.append((Group(test_file, i, str(group.get("name", "")), _named(group, alerts)),
                          {**head, "rule_files": names, "tests": [group]}))  # fmt: skip
    return found


def _run(doc: dict, rules_dir: Path, path: Path) -> tuple[bool, str]:
    """promtool test rules of one group, on the rule files of rules_dir."""
    path.write_text(yaml.safe_dump({**doc, "rule_files": [str(rules_dir / n) for n in doc["rule_files"]]}))
    proc = run_tool([binary("promtool"), "test", "rules", str(path)], cwd=path.parent)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def check_edit(layout: Layout, in_force: Path) -> tuple[bool, list[str]]:
    """The unit tests of an edit of the rules in `in_force` into the layout's rules: (passed,
    the lines of the report: what failed first, then what was left out and why). The groups run
    side by side, one promtool each (a group takes promtool a tenth of a second)."""
    changed = changed_alerts(in_force, layout.rules_dir)
    found = groups(layout, set(alert_rules(layout.rules_dir)))
    with tempfile.TemporaryDirectory(prefix="runwatch-edit-check-") as tmp:

        def judged(n: int) -> tuple[Group, str, bool] | None:
            """None if group n passes on the edit; else (it, its output, whether it fails in force too)."""
            group, doc = found[n]
            ok, output = _run(doc, layout.rules_dir, Path(tmp) / f"group-{n}.test.yml")
            if ok:
                return None
            return group, output, not _run(doc, in_force, Path(tmp) / f"group-{n}-in-force.test.yml")[0]

        kept = [n for n, (g, _) in enumerate(found) if not g.named & changed]
        with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            failing = [r for r in pool.map(judged, kept) if r is not None]
    failed = sorted(((g, out) for g, out, before in failing if not before), key=lambda f: f[0].source.name != TWO_RUNS)
    earlier = [g for g, _, before in failing if before]
    left_out = [g for g, _ in found if g.named & changed]
    return not failed, _report(layout, failed, left_out, changed, earlier)


def _report(
    layout: Layout, failed: list[tuple[Group, str]], left_out: list[Group], changed: set[str], earlier: list[Group]
) -> list[str]:
    """check_edit's lines: each failing case first (the two-runs evaluation's before the others),
    promtool's output of each failing group, then what was left out and why."""
    lines = []
    for group, output in failed:
        cases = test_failures(output) or ["failed (promtool's output below)"]
        lines += [f"{_relative(layout, group)}: {case}" for case in cases]
    for group, output in failed:
        lines += [f"{_relative(layout, group)}, promtool's output:", *output.splitlines()]
    if left_out:
        pinned = ", ".join(sorted(changed))
        lines.append(f"left out, as they pin the values of {pinned} as shipped (the backtest measures the edit): "
                     + "; ".join(g.where for g in left_out))  # fmt: skip
    if earlier:
        lines.append("left out, as they fail on the rules in force too (an earlier edit): "
                     + "; ".join(g.where for g in earlier))  # fmt: skip
    return lines


def _relative(layout: Layout, group: Group) -> str:
    where = group.where
    return f"{group.source.parent.name}/{where}" if group.source.is_relative_to(layout.root) else where

"""The static checks of the lab's YAML, run with the real promtool and amtool: `runwatch check`
prints them, `runwatch reload` refuses an edit that fails one.

promtool's output is kept once: a line it repeats (one parse error is reported again for every
rule file a config loads and every test group) is yielded the first time only, and the unit
tests are skipped while the rules do not load. A failing unit test comes first as what to
change: its file, its alert (or expression), its time and the exact difference between what
the test expects and what the rules give; promtool's own output follows, whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runwatch.core.bounded import MAX_RULE_FILE_BYTES, BoundedReadError, regular_file
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


_EVAL_ERROR = re.compile(r"^\s*rule: (?P<rule>\S+), time: (?P<time>[^,]+), err: (?P<err>.*)$")
_CASE = re.compile(r'^\s*(?:alertname: (?P<alert>\S+)|expr: (?P<expr>".*")), time: (?P<time>[^,]+),')
_SAMPLE = re.compile(r"^\s*(?P<side>exp|got): (?P<labels>\{.*?\})? ?(?P<value>\S+)?$")
_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(text: str) -> dict[str, str]:
    return dict(_PAIR.findall(text))


def _show(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_failures(output: str) -> list[str]:
    """One line per difference in promtool's output for one test file: "ALERT at TIME: what
    differs"; one per rule that fails when evaluated. For an alert, each expected alert missing,
    each unexpected one, and each annotation whose text differs; for an expression, each
    sample's value.

    >>> test_failures('''  FAILED:
    ...     expr: "up", time: 1m4s,
    ...         exp: {__name__="up"} 6.5E+01
    ...         got: {__name__="up"} 6.4E+01''')
    ['expression "up" at 1m4s: {__name__="up"}: exp 6.5E+01, got 6.4E+01']

    A rule that fails to evaluate is named once, with its first error:

    >>> test_failures('''  FAILED:
    ...     rule: Bad, time: 0s, err: many-to-many matching not allowed
    ...     rule: Bad, time: 1s, err: many-to-many matching not allowed''')
    ['Bad fails when evaluated (from 0s): many-to-many matching not allowed']
    """
    found: list[str] = []
    case, side = "", ""
    sides: dict[str, list[dict[str, dict[str, str]]]] = {}

    def flush() -> None:
        if case and sides:
            found.extend(f"{case}: {d}" for d in _differences(sides.get("exp", []), sides.get("got", [])))

    failing: set[str] = set()
    for line in output.splitlines():
        text = line.strip()
        if (m := _EVAL_ERROR.match(line)) and m["rule"] not in failing:  # its first evaluation error
            failing.add(m["rule"])
            found.append(f"{m['rule']} fails when evaluated (from {m['time']}): {m['err']}")
        elif m := _CASE.match(line):
            flush()
            what = f"{m['alert']}" if m["alert"] else f"expression {m['expr']}"
            case, side, sides = f"{what} at {m['time']}", "", {}
        elif text.startswith(("exp:[", "got:[")):
            side = text[:3]
            sides[side] = []
        elif text.startswith("Labels:{") and side:
            sides[side].append({"labels": _labels(text), "annotations": {}})
        elif text.startswith("Annotations:{") and side and sides[side]:
            sides[side][-1]["annotations"] = _labels(text)
        elif (m := _SAMPLE.match(line)) and case.startswith("expression"):
            sides.setdefault(m["side"], []).append(
                {"labels": _labels(m["labels"] or ""), "annotations": {"value": m["value"] or ""}}
            )
    flush()
    return found


def _differences(exp: list[dict], got: list[dict]) -> list[str]:
    out = []
    got_by = {_show(g["labels"]): g for g in got}
    exp_by = {_show(e["labels"]): e for e in exp}
    for key, e in exp_by.items():
        g = got_by.get(key)
        if g is None:
            out.append(f"expected {key}, which the rules do not give")
            continue
        for name in sorted(set(e["annotations"]) | set(g["annotations"])):
            a, b = e["annotations"].get(name), g["annotations"].get(name)
            if a != b:
                what = "value" if name == "value" and "value" in g["annotations"] else f"annotation {name}"
                shown = [repr(x) if x is not None else "(none)" for x in (a, b)] if what != "value" else [a, b]
                out.append(
                    f"{key}: {what}: exp {shown[0]}, got {shown[1]}" if what != "value" else f"{key}: exp {a}, got {b}"
                )
    out += [f"got {key}, which the test does not expect" for key in got_by if key not in exp_by]
    return out


def run_check(check: Check, cwd: Path) -> tuple[bool, str]:
    proc = run_tool(check.argv, cwd=cwd)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def run_all(
    layout: Layout, unit_tests: Callable[[Layout], tuple[bool, list[str]]] | None = None
) -> Iterator[tuple[Check, bool | None, list[str]]]:
    """Each check in turn: (check, passed or None if skipped, the lines of its output worth reading).

    Blank lines, the missing-targets warnings and every line already shown by an earlier check
    (or earlier in this one) are left out; promtool's headings stay, so each error keeps its file.
    `unit_tests`, when given, runs the unit tests instead: (passed, the lines to show). A
    learner's edit is checked so (runwatch.prom.edits.check_edit).
    """
    shown: set[str] = set()
    rules_load = True
    for check in checks(layout):
        if check.name == TEST_RULES and not rules_load:
            yield check, None, ["skipped: the rules do not load (above)"]
            continue
        # Before promtool or amtool reads a file: zz.yml -> /dev/zero took promtool to 3.3 GB, and
        # `check config` and the unit tests read the rule files too (issue 40).
        unreadable = _unreadable(check.files)
        if unreadable:
            rules_load = rules_load and check.name != "promtool check rules"
            yield check, False, unreadable
            continue
        if check.name in ("promtool check config", TEST_RULES) and _unreadable(layout.rule_files()):
            yield check, None, ["skipped: the rules do not load (above)"]
            continue
        if check.name == TEST_RULES and unit_tests is not None:
            yield check, *unit_tests(layout)
            continue
        if check.name == TEST_RULES:  # a promtool a file (promtool 3 names no file in its output), side by side
            with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
                each = list(pool.map(lambda f, c=check: (f, *run_check(_one_file(c, f), layout.root)), check.files))
            ok = all(passed for _, passed, _ in each)
            passed = [line for _, _, out in each for line in out.splitlines() if line.strip()]  # for --verbose
            yield check, ok, passed if ok else _test_report(layout.root, each)
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


def _unreadable(files: list[Path]) -> list[str]:
    """A line for each file that is not a regular file of at most MAX_RULE_FILE_BYTES (issue 40)."""
    lines = []
    for f in files:
        try:
            regular_file(f, "a file of the configuration", MAX_RULE_FILE_BYTES)
        except (OSError, BoundedReadError) as err:
            lines.append(str(err) if isinstance(err, BoundedReadError) else f"{f}: cannot read it: {err.strerror}")
    return lines


def _one_file(check: Check, test_file: Path) -> Check:
    return Check(check.name, [*check.argv[:3], str(test_file)], [test_file])


def _test_report(cwd: Path, each: list[tuple[Path, bool, str]]) -> list[str]:
    """A failed `promtool test rules`: each failing case first, with its file, then promtool's
    output for the failing files, its SUCCESS lines left out and nothing else (every label of
    `got` is what to compare)."""
    first, raw = [], []
    for test_file, ok, output in each:
        if ok:
            continue
        where = str(test_file.relative_to(cwd)) if test_file.is_relative_to(cwd) else str(test_file)
        first += [f"{where}: {case}" for case in test_failures(output)] or [
            f"{where}: failed (promtool's output below)"
        ]
        raw += [f"{where}:", *(line for line in output.splitlines() if line.strip() and line.strip() != "SUCCESS")]
    return [*first, "promtool's output:", *raw]


# --- after a reload: what only a running Prometheus can say ---

# Groups evaluated at most this far apart are waited for after a reload; a slower one (cluster.yml's
# 30 s runwatch-cluster-10m) may first evaluate half a minute after it, and is judged on what it
# has done by the time the others have.
PACED_S = 5.0
MISSED = "prometheus_rule_group_iterations_missed_total"
POLL_S = 0.25  # how often /api/v1/rules is read while waiting for the new groups' evaluations


def _seconds(rfc3339: str) -> float:
    """Prometheus's lastEvaluation (RFC 3339 with nanoseconds) as a Unix time; 0 for never."""
    from datetime import datetime

    head, _, rest = rfc3339.rstrip("Z").partition(".")
    frac = "".join(c for c in rest if c.isdigit())[:6]
    when = datetime.fromisoformat(head + (f".{frac}" if frac else "") + "+00:00")
    return 0.0 if when.year < 1970 else when.timestamp()


def evaluation_problems(prometheus: str, since: float, query_timeout: float) -> list[str]:
    """What Prometheus's own rule-group health says of the rules in force since `since` (a reload,
    on this machine's clock, as Prometheus's): each group whose first evaluation since took longer
    than its interval, or that missed iterations, and each rule whose evaluation failed, one line
    each. Empty: every group keeps up with its interval. Only groups paced within PACED_S are
    waited for (a slower group is judged on what it has done by then).

    Decided from `/api/v1/rules` (each group's lastEvaluation, the start of its last completed
    evaluation, with its evaluationTime and interval; each rule's health and lastError) and
    Prometheus's prometheus_rule_group_iterations_missed_total. It waits for every group to
    complete an evaluation that started after the reload, however long the machine takes, up to
    a bound no group that keeps up can reach: a group's first evaluation starts within one interval
    of the reload, and Prometheus ends each rule's query at `query_timeout` (its --query.timeout,
    longer than any interval), so one still unfinished interval + query_timeout after the reload
    has run longer than its interval. The answer is the same on a fast machine and a loaded one.

        >>> evaluation_problems("http://127.0.0.1:9090", since=time.time(), query_timeout=20)
        ['group slow: an evaluation took 20.00s, longer than its interval of 1s']
    """
    import time  # here: `runwatch check` needs neither

    import requests

    def groups() -> list[dict]:
        return requests.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]

    def paced(g: dict) -> bool:
        return float(g.get("interval", 1)) <= PACED_S

    before = _missed(prometheus)
    new = groups()
    slowest = max((float(g.get("interval", 1)) for g in new if paced(g)), default=1.0)
    deadline = since + slowest + query_timeout + 2 * POLL_S
    while any(_seconds(g.get("lastEvaluation", "")) < since for g in new if paced(g)) and time.time() < deadline:
        time.sleep(POLL_S)
        new = groups()
    lost = {name: n - before.get(name, 0.0) for name, n in _missed(prometheus).items()}
    return [line for g in new for line in _group_problems(g, since, lost.get(g["name"], 0.0), deadline - since)]


def _group_problems(g: dict, since: float, lost: float, waited: float) -> list[str]:
    """One rule group's problems, as evaluation_problems finds them."""
    name, interval = g["name"], float(g.get("interval", 1))
    problems = []
    if _seconds(g.get("lastEvaluation", "")) < since:  # a group slower than PACED_S: not yet, and not waited for
        if interval <= PACED_S:
            problems.append(f"group {name}: no evaluation completed in {waited:.1f}s, for an interval of {interval:g}s")
    elif float(g.get("evaluationTime", 0)) > interval:
        problems.append(f"group {name}: an evaluation took {float(g['evaluationTime']):.2f}s, "
                        f"longer than its interval of {interval:g}s")  # fmt: skip
    if lost > 0:
        problems.append(f"group {name}: missed {lost:g} iterations since the reload")
    return problems + [f"{r['name']} (group {name}): {r.get('lastError', '')}" for r in g["rules"]
                       if r.get("health") == "err"]  # fmt: skip


def _missed(prometheus: str) -> dict[str, float]:
    """Iterations each rule group has missed so far, by group name (its label is `file;group`)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{prometheus}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == MISSED:
                group = sample.labels.get("rule_group", "").rsplit(";", 1)[-1]
                found[group] = found.get(group, 0.0) + sample.value
    return found

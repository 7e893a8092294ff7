"""Stage 1 of the backtest: a rules folder, read as the backtest evaluates it.

    rules = load_rules(Layout().rules_dir, binary("promtool"))

promtool checks the files first (bounded reads: issue 40); then each group's recording and
alerting rules are kept with where they sit (the plan reads a recording late or fresh by
them). Each alert's `for:` and `keep_firing_for:` are read here (holds): the plan has
Prometheus evaluate them, and an alert whose pair no query over stored data can replay is
refused by name.

The first stage: it imports none of the others (plan, data, evaluate, report).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from runwatch.backtest.inline import references
from runwatch.core.bounded import MAX_RULE_FILE_BYTES, BoundedReadError, load_yaml, regular_file
from runwatch.core.command import UsageError
from runwatch.core.durations import duration_seconds
from runwatch.core.names import META_GROUP
from runwatch.core.paths import Layout
from runwatch.prom.tools import run_tool

# A recording rule over ALERTS (alerts.yml's first-fire record) has no input here: the
# backfill writes no ALERTS series. Nor can one that reads its own last value (a live
# Prometheus's carried state: alerts.yml's record of a trainer target's run, kept while the target
# is down) be replayed by a range query: both are left out, as a live lab's bookkeeping.
LIVE_ALERTS = re.compile(r"\bALERTS(_FOR_STATE)?\b")


@dataclass
class Rules:
    """The rules of a directory, split as the backtest needs them, and where each one is."""

    recording: list[dict] = field(default_factory=list)  # {"record", "expr", ...}
    alerting: list[dict] = field(default_factory=list)  # {"alert", "expr", "for", ...}
    recorded_at: dict[str, tuple[str, int]] = field(default_factory=dict)  # record -> (group, position)
    alert_at: list[tuple[str, int]] = field(default_factory=list)  # alerting[i]'s (group, position)


def holds(rule: dict) -> tuple[int, int]:
    """An alert's (`for:`, `keep_firing_for:`) in whole evaluations, 1 s apart. UsageError
    naming the alert when it has both: Prometheus keeps such an alert firing through each gap
    shorter than keep_firing_for without waiting its `for:` again, a state carried from
    evaluation to evaluation that no query over stored data replays.

        >>> holds({"alert": "ThroughputDrop", "expr": "x < 1", "keep_firing_for": "30s"})
        (0, 30)
    """
    name = rule["alert"]
    hold = int(round(duration_seconds(str(rule.get("for", "0s")), f"--rules: for: of alert {name}")))
    keep = duration_seconds(str(rule.get("keep_firing_for", "0s")), f"--rules: keep_firing_for: of alert {name}")
    if hold and round(keep):
        raise UsageError(f"--rules: alert {name} cannot be backtested: it has both for: and keep_firing_for:, "
                         "whose state no query over stored data replays; backtest it with one of them")  # fmt: skip
    return hold, int(round(keep))


def load_rules(rules_dir: Path, promtool: str) -> Rules:
    """The rules of `rules_dir` as Prometheus loads them (rules/*.yml), checked by promtool;
    UsageError naming --rules when a file is refused or an alert cannot be backtested."""
    files = Layout().rule_files(rules_dir)  # what prometheus.yml loads: rules/*.yml
    if not files:
        raise UsageError(f"--rules: no .yml rule files in {rules_dir}")
    for f in files:  # before promtool reads them: a.yml -> /dev/zero took it to 8.5 GB in 5 s
        try:
            regular_file(f, "a rule file", MAX_RULE_FILE_BYTES)  # through a symlink: what would be read
        except BoundedReadError as err:
            raise UsageError(f"--rules: {err}") from None
    proc = run_tool([promtool, "check", "rules", *map(str, files)])
    if proc.returncode != 0:
        raise UsageError(f"--rules: promtool check rules refused {rules_dir}:\n{(proc.stdout + proc.stderr).strip()}")
    rules = Rules()
    for f in files:
        try:  # promtool has read them; no alias bomb for PyYAML either
            doc = load_yaml(f, "a rule file") or {}
        except BoundedReadError as err:
            raise UsageError(f"--rules: {err}") from None
        for group in (doc if isinstance(doc, dict) else {}).get("groups", []):
            if group.get("name") == META_GROUP:
                continue
            for pos, rule in enumerate(group.get("rules", [])):
                if "record" in rule and LIVE_ALERTS.search(rule["expr"]):
                    continue  # bookkeeping of a live Prometheus's alerts; the evaluation reads first fires itself
                if "record" in rule and rule["record"] in {ref.name for ref in references(rule["expr"])}:
                    continue  # carried state; TrainerDown then reads up alone, which is all a replay has
                if "record" in rule:
                    rules.recording.append(rule)
                    rules.recorded_at[rule["record"]] = (group["name"], pos)
                else:
                    rules.alerting.append(rule)
                    rules.alert_at.append((group["name"], pos))
    for rule in rules.alerting:  # before any run is trained: an alert that cannot be replayed is said first
        holds(rule)
    return rules


def written(rules_dir: Path, flag: str = "--rules") -> list[dict]:
    """Every rule of a rules folder's files, as written (bounded, no aliases: issue 40), meta
    rules included; UsageError naming `flag` for a file that cannot be read so."""
    try:
        docs = [load_yaml(f, "a rule file") or {} for f in Layout().rule_files(rules_dir)]
    except BoundedReadError as err:
        raise UsageError(f"{flag}: {err}") from None
    return [r for d in docs for g in (d if isinstance(d, dict) else {}).get("groups", []) for r in g.get("rules", [])]

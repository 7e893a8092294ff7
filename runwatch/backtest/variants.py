"""The sweep's edits of the rules (stage 1's, after rules.py): one alert at several values of its
threshold or its `for:`, each a variant evaluated beside the rules in force on the same runs.

    swept = parse_sweep("HeldOutGap=1.5,1.8,2")
    rules = variants(swept)(load_rules(rules_dir, promtool))

For a threshold, a variant reads a threshold recording of its own
(`alert:runwatch_threshold:ratio{alertname="HeldOutGap@1.8"}`, recorded as `vector(1.8)` in the
group of the one in force, and inlined as that one is); for a `for:`, it is the alert with that
`for:`. The trade-off each variant makes is read in sweep.py, after the evaluation.

Not for an alert whose expression names no threshold recording of its own: sweep its `for:`,
or edit the expression and backtest each edit.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from runwatch.backtest.inline import references
from runwatch.backtest.rules import Rules
from runwatch.core.command import UsageError
from runwatch.core.durations import duration_seconds
from runwatch.core.names import THRESHOLD

MAX_VALUES = 32  # each value is one more query over every run


@dataclass(frozen=True)
class Sweep:
    """One alert, one field ("threshold" or "for") and the values to try, as written."""

    alert: str
    field: str
    values: tuple[str, ...]

    def name(self, value: str) -> str:
        """The variant's alert name, as the results carry it: HeldOutGap@1.8, HeldOutGap@for=20s."""
        return f"{self.alert}@{value}" if self.field == "threshold" else f"{self.alert}@for={value}"

    @property
    def names(self) -> list[str]:
        return [self.name(v) for v in self.values]


_NUMBER = r"\d*\.?\d+(?:[eE][-+]?\d+)?"
_SEC = r"(?:\d+(?:ms|s|m|h))+"


def parse_sweep(text: str) -> Sweep:
    """'ALERT=2,2.5,3', 'ALERT=2-5:0.5' (a range and its step), 'ALERT.for=0s,10s,20s' or
    'ALERT.for=0s-30s:5s' -> Sweep; UsageError naming --sweep otherwise."""
    m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)(\.for)?\s*=\s*(.+?)\s*", text)
    if m is None:
        raise UsageError(f"--sweep: expected ALERT=V1,V2,... or ALERT.for=D1,D2,..., got {text!r}")
    alert, field, body = m[1], "for" if m[2] else "threshold", m[3]
    unit = _SEC if field == "for" else _NUMBER
    what = "durations such as 0s,10s,20s or 0s-30s:5s" if field == "for" else "numbers such as 2,3,4 or 2-5:0.5"
    span = re.fullmatch(rf"({unit})-({unit}):({unit})", body)
    if span is not None:
        lo, hi, step = (_value(v, field) for v in span.groups())
        if step <= 0 or hi <= lo:
            raise UsageError(f"--sweep: the range {body} must run upward by a positive step")
        count = int(round((hi - lo) / step)) + 1
        if count > MAX_VALUES:
            raise UsageError(f"--sweep: at most {MAX_VALUES} values, got {count} from {body}")
        numbers = [lo + i * step for i in range(count) if lo + i * step <= hi + 1e-9]
        values = [f"{int(round(v))}s" if field == "for" else f"{round(v, 9):g}" for v in numbers]
    else:
        values = [v.strip() for v in body.split(",")]
        if not all(re.fullmatch(unit, v) for v in values):
            raise UsageError(f"--sweep: {alert}'s values must be {what}, got {body!r}")
        for v in values:
            _value(v, field)
    if len(values) > MAX_VALUES:
        raise UsageError(f"--sweep: at most {MAX_VALUES} values, got {len(values)}")
    if len(set(values)) != len(values):
        raise UsageError(f"--sweep: a value is given twice in {body!r}")
    return Sweep(alert, field, tuple(values))


def _value(text: str, field: str) -> float:
    if field == "threshold":
        return float(text)
    seconds = duration_seconds(text, "--sweep")
    if seconds != int(seconds):  # the rules evaluate every second
        raise UsageError(f"--sweep: a for: must be whole seconds, got {text!r}")
    return seconds


def variants(sweep: Sweep) -> Callable[[Rules], Rules]:
    """An edit of the backtest's rules (backtest(edit=...), its Rules): the alert's variants added beside it."""

    def edit(rules: Rules) -> Rules:
        found = [i for i, r in enumerate(rules.alerting) if r["alert"] == sweep.alert]
        if not found:
            known = ", ".join(dict.fromkeys(r["alert"] for r in rules.alerting))
            raise UsageError(f"--sweep: the rules have no alert {sweep.alert!r}; they have {known}")
        i = found[0]
        rule, where = rules.alerting[i], rules.alert_at[i]
        out = dataclasses.replace(rules, recording=list(rules.recording), alerting=list(rules.alerting),
                                  alert_at=list(rules.alert_at))  # fmt: skip
        for value in sweep.values:
            name = sweep.name(value)
            if sweep.field == "for":
                out.alerting.append({**rule, "alert": name, "for": value})
            else:
                out.alerting.append({**rule, "alert": name, "expr": _reading(rule["expr"], sweep.alert, name)})
                out.recording.append({"record": THRESHOLD, "labels": {"alertname": name}, "expr": f"vector({value})"})
            out.alert_at.append(where)
        return out

    return edit


IN_FORCE = "in-force"  # the rule in force beside an edit: ALERT@in-force


def with_in_force(sweep: Sweep, in_force_rules: list[dict]) -> Callable[[Rules], Rules]:
    """An edit of the backtest's rules (backtest(edit=...)): the alert as the rules in force
    write it, beside the edited one, as ALERT@in-force, reading a threshold recording of its own
    (the in-force value). With it a backtest of an edit compares the edit with the rule in force
    on the same runs, whatever the edit changed (threshold, for: or expression)."""
    name = f"{sweep.alert}@{IN_FORCE}"
    rule = next((r for r in in_force_rules if r.get("alert") == sweep.alert), None)
    if rule is None:
        raise UsageError(f"--edit-of: the rules in force have no alert {sweep.alert!r} to compare the edit with")
    recorded = next((r for r in in_force_rules if r.get("record") == THRESHOLD
                     and (r.get("labels") or {}).get("alertname") == sweep.alert), None)  # fmt: skip

    def edit(rules: Rules) -> Rules:
        i = next(i for i, r in enumerate(rules.alerting) if r["alert"] == sweep.alert)
        out = dataclasses.replace(rules, recording=list(rules.recording), alerting=list(rules.alerting),
                                  alert_at=[*rules.alert_at, rules.alert_at[i]])  # fmt: skip
        reads = recorded is not None and any(r.name == THRESHOLD for r in references(str(rule["expr"])))
        expr = _reading(str(rule["expr"]), sweep.alert, name) if reads else str(rule["expr"])
        out.alerting.append({**rule, "alert": name, "expr": expr})
        if reads:
            out.recording.append({"record": THRESHOLD, "labels": {"alertname": name}, "expr": recorded["expr"]})
        return out

    return edit


def _reading(expr: str, alert: str, name: str) -> str:
    """The alert's expression reading the threshold recorded for `name` instead of its own."""
    refs = [r for r in references(expr) if r.name == THRESHOLD and (r.matchers or {}).get("alertname") == alert]
    if not refs:
        raise UsageError(
            f'--sweep: {alert}\'s expression reads no {THRESHOLD}{{alertname="{alert}"}}: sweep its for: '
            f"({alert}.for=...), or put the threshold back in its recording rule"
        )
    for ref in sorted(refs, key=lambda r: -r.start):  # from the end: earlier offsets stay valid
        text = re.sub(rf'(alertname\s*=\s*"){re.escape(alert)}"', rf'\g<1>{name}"', expr[ref.start : ref.end], count=1)
        expr = expr[: ref.start] + text + expr[ref.end :]
    return expr


def in_force(rules_text: list[dict], sweep: Sweep) -> str | None:
    """The value of the rule in force, as written: its `for:`, or its threshold when its recording
    is a plain vector(N); None when it cannot be read so."""
    if sweep.field == "for":
        rule = next((r for r in rules_text if r.get("alert") == sweep.alert), None)
        return str(rule.get("for", "0s")) if rule else None
    for r in rules_text:
        if r.get("record") == THRESHOLD and (r.get("labels") or {}).get("alertname") == sweep.alert:
            m = re.fullmatch(rf"\s*vector\(\s*({_NUMBER})\s*\)\s*", str(r["expr"]))
            return f"{float(m[1]):g}" if m else None
    return None


def same(value: str, forced: str | None, sweep: Sweep) -> bool:
    """Whether a sweep's value is the value in force (2.50 is 2.5; 1m is 60s)."""
    if forced is None:
        return False
    try:
        return _value(value, sweep.field) == _value(forced, sweep.field)
    except (UsageError, ValueError):
        return value == forced

"""The rule workbench's readouts: what each alert catches at each size of incident, and what one
alert trades at each value of its threshold or its `for:`.

    runwatch backtest --strengths 0.05-1 --sweep TrainingLossJump=2,2.5,3,4,5 --plot sweep.png
    runwatch backtest --strengths 0.05-1 --sweep HeldOutGap.for=0s,5s,10s,20s

A sweep value is a variant of the alert, evaluated in Prometheus beside the rules in force, on
the same runs: for a threshold, the alert's expression reads its own threshold recording
(`alert:runwatch_threshold:ratio{alertname="HeldOutGap@1.8"}`, recorded as `vector(1.8)` in the
group of the one in force, and inlined as that one is); for a `for:`, the alert with that `for:`.
Nothing here decides whether an alert fired: it renames, counts and draws what Prometheus said.

Per value, a sweep reports the runs caught in each incident the plate says the alert catches
(first fire at or after the onset), by strength band; the median and worst delay after the onset
(steps; a fault's, seconds after it); and false alarms per hundred run-hours: each time the
alert began to fire in a run where the plate says it stays silent (healthy runs and the
incidents it should not page on), over those runs' lab hours.

Not for an alert whose expression names no threshold recording of its own: sweep its `for:`,
or edit the expression and backtest each edit.
"""

from __future__ import annotations

import dataclasses
import io
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runwatch.backtest import signatures
from runwatch.backtest.inline import references
from runwatch.core.command import UsageError
from runwatch.core.durations import duration_seconds
from runwatch.core.files import write_atomic
from runwatch.core.names import THRESHOLD
from runwatch.trainer.config import SCALED_INCIDENTS, TrainConfig

MAX_VALUES = 32  # each value is one more query over every run
ONSET = TrainConfig().onset  # the backtest's runs all start their incident here
HOUR = 3600.0
# what the backtest passes in: its Rules (alerting, recording, alert_at) and its Result (runs)
Rules = Result = Any


# --strengths: a range is cut into this many bands of equal width for the table
STRENGTH_BANDS = 4


@dataclass(frozen=True)
class Strengths:
    """Each incident run's strength (trainer.config's TrainConfig.strength), drawn from its seed
    and incident: uniformly over [low, high], to the thousandth, or from `values` in turn by seed.
    A healthy run and a fault have none (1).

        >>> Strengths(values=(0.1, 0.5)).of(7, "lr_spike")
        0.5
    """

    low: float = 1.0
    high: float = 1.0
    values: tuple[float, ...] = ()

    @property
    def spec(self) -> str:
        return ",".join(f"{v:g}" for v in self.values) if self.values else f"{self.low:g}-{self.high:g}"

    def of(self, seed: int, incident: str) -> float:
        if incident not in SCALED_INCIDENTS:
            return 1.0
        if self.values:
            return self.values[seed % len(self.values)]
        u = random.Random(f"strength/{seed}/{incident}").random()  # a str seed: the same on every machine
        return round(self.low + u * (self.high - self.low), 3)

    def bands(self) -> list[tuple[float, float]]:
        """The table's strength bands, weakest first: each value of a list, or a range in equal parts."""
        if self.values:
            return [(v, v) for v in sorted(set(self.values))]
        width = (self.high - self.low) / STRENGTH_BANDS
        return [(self.low + i * width, self.low + (i + 1) * width) for i in range(STRENGTH_BANDS)]

    def band(self, strength: float) -> str:
        """The band a run's strength falls in, as the table names it."""
        for lo, hi in self.bands():
            if lo == hi == strength or lo <= strength < hi or strength == hi == self.high:
                return f"{lo:g}" if lo == hi else f"{lo:.2f}-{hi:.2f}"
        return f"{strength:g}"


def parse_strengths(text: str) -> Strengths:
    """'0.05-1' (a range) or '0.1,0.3,1' (a list) -> Strengths; UsageError naming --strengths otherwise."""
    usage = f"--strengths: expected a range like 0.05-1 or a list like 0.1,0.3,1 of strengths in (0, 1], got {text!r}"
    number_ = r"\s*(\d*\.?\d+(?:[eE][-+]?\d+)?)\s*"
    m = re.fullmatch(f"{number_}-{number_}", text)
    try:
        values = (float(m[1]), float(m[2])) if m else tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(usage) from None
    if not all(0.001 <= v <= 1 for v in values):  # NaN fails too; a thousandth is the finest drawn
        raise UsageError(usage)
    if m is None:
        return Strengths(values=values)
    if values[0] >= values[1]:
        raise UsageError(f"--strengths: the range {text} must run from a weaker strength to a stronger one")
    return Strengths(low=values[0], high=values[1])


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


def variants(sweep: Sweep):
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


# --- what each alert caught, by incident and strength band ---


def delay(run: dict, alert: str) -> float | None:
    """Steps from the onset to the alert's first fire (a fault's: seconds from it); None if it
    never fired, or fired before the onset (then it caught nothing: it was paging already)."""
    if "after_fault" in run:
        return run["after_fault"][alert]
    step = run["first_fire"][alert]
    return None if step is None or step < ONSET else step - ONSET


def _stats(delays: list[float]) -> dict:
    return {"median": statistics.median(delays) if delays else None, "worst": max(delays) if delays else None}


def catches(result: Result, strengths: Strengths | None, alerts: list[str], judge: str | None = None) -> dict:
    """incident -> band -> alert -> {caught, runs, median, worst}, over the incidents the plate
    says `judge` (each alert itself, when None) catches."""
    out: dict = {}
    for incident in signatures.INCIDENTS + signatures.CLUSTER_INCIDENTS:
        runs = [r for r in result.runs if r["incident"] == incident]
        for alert in alerts:
            expect = signatures.expectation(incident, judge or alert)
            if not runs or expect is None or expect.fires is None:
                continue
            for band, inband in _by_band(runs, strengths).items():
                found = [d for d in (delay(r, alert) for r in inband) if d is not None]
                cell = {"caught": len(found), "runs": len(inband), **_stats(found)}
                out.setdefault(incident, {}).setdefault(band, {})[alert] = cell
    return out


def _by_band(runs: list[dict], strengths: Strengths | None) -> dict[str, list[dict]]:
    if strengths is None:
        return {"1": runs}
    out: dict[str, list[dict]] = {strengths.band(lo): [] for lo, _ in strengths.bands()}  # weakest first
    for r in runs:
        out.setdefault(strengths.band(r["strength"]), []).append(r)
    return {b: rs for b, rs in out.items() if rs}


def false_alarms(result: Result, alert: str, judge: str) -> dict:
    """How often `alert` began to fire where the plate says `judge` stays silent, per hundred
    run-hours of those runs."""
    silent = [r for r in result.runs if signatures.expectation(r["incident"], judge) == signatures.SILENT]
    pages = sum(r["began"][alert] for r in silent)
    hours = sum(r["seconds"] for r in silent) / HOUR
    runs = sum(r["began"][alert] > 0 for r in silent)
    return {"pages": pages, "runs": runs, "of_runs": len(silent), "run_hours": round(hours, 2),
            "per_100_run_hours": round(100 * pages / hours, 1) if hours else None}  # fmt: skip


def trade_off(result: Result, sweep: Sweep, strengths: Strengths | None, current: str | None) -> list[dict]:
    """One row per value, the rule in force first: its catches, delays and false alarms."""
    rows = [(sweep.alert, current, True)] + [(sweep.name(v), v, v == current) for v in sweep.values]
    out = []
    for name, value, forced in rows:
        caught = catches(result, strengths, [name], judge=sweep.alert)
        delays = [d for r in result.runs if _judged(r, sweep.alert) for d in [delay(r, name)] if d is not None]
        out.append({"alert": name, "value": value, "in_force": name == sweep.alert, "same_as_in_force": forced,
                    "caught": {i: {b: c[name] for b, c in bands.items()} for i, bands in caught.items()},
                    "caught_total": sum(r["first_fire"][name] is not None and delay(r, name) is not None
                                        for r in result.runs if _judged(r, sweep.alert)),
                    "should_catch": sum(_judged(r, sweep.alert) for r in result.runs),
                    **_stats(delays), "false_alarms": false_alarms(result, name, sweep.alert)})  # fmt: skip
    return out


def _judged(run: dict, alert: str) -> bool:
    expect = signatures.expectation(run["incident"], alert)
    return expect is not None and expect.fires is not None


# --- the report ---


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def catches_table(cells: dict, alerts: list[str]) -> str:
    """Per incident and strength band: runs caught of runs, median (worst) delay after the onset."""
    head = "caught/runs, median (worst) steps after the onset (a fault's: seconds), by strength"
    alerts = [a for a in alerts if any(a in by_alert for bands in cells.values() for by_alert in bands.values())]
    rows = [["incident", "strength", *alerts]]
    for incident, bands in cells.items():
        for band, by_alert in bands.items():
            row = [incident, band]
            for a in alerts:
                c = by_alert.get(a)
                row.append("" if c is None else f"{c['caught']}/{c['runs']} {_num(c['median'])} ({_num(c['worst'])})")
            rows.append(row)
    return head + "\n\n" + _columns(rows)


def sweep_table(rows: list[dict], sweep: Sweep) -> str:
    """One line per value: caught/runs in each incident, band by band (weakest first), the delays
    and the false alarms."""
    field = "threshold" if sweep.field == "threshold" else "for:"
    incidents = list(dict.fromkeys(i for r in rows for i in r["caught"]))
    bands = {i: list(dict.fromkeys(b for r in rows for b in r["caught"].get(i, {}))) for i in incidents}
    out = [[field, *incidents, "delay median", "worst", "false/100h", "silent runs paged"]]
    for r in rows:
        value = (r["value"] or "as written") + (" *" if r["in_force"] else "")
        caught = [" ".join(f"{c['caught']}/{c['runs']}" for b in bands[i] for c in [r["caught"].get(i, {}).get(b)] if c)
                  for i in incidents]  # fmt: skip
        fa = r["false_alarms"]
        out.append([value, *caught, _num(r["median"]), _num(r["worst"]), _num(fa["per_100_run_hours"]),
                    f"{fa['runs']}/{fa['of_runs']}"])  # fmt: skip
    legend = "; ".join(f"{i} {' '.join(bands[i])}" for i in incidents)
    title = (
        f"sweep of {sweep.alert}'s {field} (* the rule in force): runs caught by strength band ({legend}); delay "
        "after the onset in steps; false alarms per 100 run-hours of the runs where it should stay silent"
    )
    return title + "\n\n" + _columns(out)


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(r[j]) for r in rows) + 2 for j in range(len(rows[0]))]
    return "\n".join("".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def plot(rows: list[dict], sweep: Sweep, path: Path) -> None:
    """The trade-off: median delay after the onset against false alarms per 100 run-hours, one
    point per value, the rule in force marked. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
    points, force = [r for r in rows if not r["in_force"]], rows[0]

    def fa(r: dict) -> float:
        return r["false_alarms"]["per_100_run_hours"] or 0.0

    def nan(v: float | None) -> float:
        return float("nan") if v is None else v

    what = "threshold" if sweep.field == "threshold" else "for:"

    def share(r: dict) -> float:
        return 100 * r["caught_total"] / max(1, r["should_catch"])

    panels = ((left, lambda r: nan(r["median"]), "median steps from the onset to the first fire"),
              (right, share, "% of the incident runs caught"))  # fmt: skip
    for ax, y, label in panels:
        ax.plot([fa(r) for r in points], [y(r) for r in points], "o-", color="#1f77b4", label=f"each {what}")
        for k, r in enumerate(points):  # labels above and below in turn: close points stay readable
            ax.annotate(r["value"], (fa(r), y(r)), textcoords="offset points", xytext=(6, 8 if k % 2 else -12),
                        fontsize=8)  # fmt: skip
        ax.plot(
            [fa(force)], [y(force)], "*", ms=16, color="#d62728", label=f"in force ({force['value'] or 'as written'})"
        )
        ax.set_xlabel("false alarms per 100 run-hours (runs it should stay silent in)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{sweep.alert}: what each {what} trades", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_atomic(path, buf.getvalue())

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


IN_FORCE = "in-force"  # the rule in force beside an edit: ALERT@in-force


def with_in_force(sweep: Sweep, in_force_rules: list[dict]):
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


def trade_off(
    result: Result, sweep: Sweep, strengths: Strengths | None, current: str | None, in_force: str | None = None
) -> list[dict]:
    """One row per value: its catches, delays and false alarms. First the rule as written: the
    rule in force, or with `in_force` (the value of the rule in force, with_in_force's variant
    evaluated) the edit, then the rule in force; then the sweep's values, the one equal to the
    value in force marked so."""
    edit = in_force is not None or any(a.endswith(f"@{IN_FORCE}") for a in result.alerts)
    rows = [(sweep.alert, current, "edit" if edit else "in force")]
    rows += [(f"{sweep.alert}@{IN_FORCE}", in_force, "in force")] if edit else []
    forced = in_force if edit else current
    rows += [(sweep.name(v), v, "= in force" if _same(v, forced, sweep) else "") for v in sweep.values]
    out = []
    for name, value, role in rows:
        caught = catches(result, strengths, [name], judge=sweep.alert)
        delays = [d for r in result.runs if _judged(r, sweep.alert) for d in [delay(r, name)] if d is not None]
        out.append({"alert": name, "value": value, "role": role, "in_force": role == "in force",
                    "same_as_in_force": role in ("in force", "= in force"),
                    "caught": {i: {b: c[name] for b, c in bands.items()} for i, bands in caught.items()},
                    "caught_total": sum(r["first_fire"][name] is not None and delay(r, name) is not None
                                        for r in result.runs if _judged(r, sweep.alert)),
                    "should_catch": sum(_judged(r, sweep.alert) for r in result.runs),
                    **_stats(delays), "false_alarms": false_alarms(result, name, sweep.alert)})  # fmt: skip
    return out


def _same(value: str, forced: str | None, sweep: Sweep) -> bool:
    """Whether a sweep's value is the value in force (2.50 is 2.5; 1m is 60s)."""
    if forced is None:
        return False
    try:
        return _value(value, sweep.field) == _value(forced, sweep.field)
    except (UsageError, ValueError):
        return value == forced


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


MARKS = {"in force": " * in force", "edit": " (the edit)", "= in force": " (= in force)", "": ""}


def sweep_cells(rows: list[dict], sweep: Sweep) -> tuple[str, list[list[str]]]:
    """The trade-off as a table: (its title, its rows of cells, the header first): one line per
    value, the rule in force marked `*`, the edit marked as the edit: caught/runs in each
    incident, band by band (weakest first), the delays and the false alarms. The terminal prints
    it (sweep_table); the console draws it from the backtest's --json."""
    field = "threshold" if sweep.field == "threshold" else "for:"
    incidents = list(dict.fromkeys(i for r in rows for i in r["caught"]))
    bands = {i: list(dict.fromkeys(b for r in rows for b in r["caught"].get(i, {}))) for i in incidents}
    out = [[field, *incidents, "delay median", "worst", "false/100h", "silent runs paged"]]
    for r in rows:
        value = (r["value"] or "as written") + MARKS[r.get("role", "in force" if r["in_force"] else "")]
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
    return title, out


def sweep_table(rows: list[dict], sweep: Sweep) -> str:
    """sweep_cells, in columns for the terminal."""
    title, cells = sweep_cells(rows, sweep)
    return title + "\n\n" + _columns(cells)


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(r[j]) for r in rows) + 2 for j in range(len(rows[0]))]
    return "\n".join("".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


# The plot's colours: each value of the sweep along viridis (low to high), the rule in force
# and the edit in the colours the console and the dashboards give them (grey and orange).
IN_FORCE_COLOUR, EDIT_COLOUR = "#555555", "#ff7f0e"
MARKERS = "osD^vP<>Xhp"  # each sweep value its own shape as well as its colour: two points on one spot stay told apart


def _fa(r: dict) -> float:
    return r["false_alarms"]["per_100_run_hours"] or 0.0


def _share(r: dict) -> float:
    return 100 * r["caught_total"] / max(1, r["should_catch"])


def _median(r: dict) -> float:
    return float("nan") if r["median"] is None else r["median"]


def _points(rows: list[dict]) -> list[tuple[dict, dict]]:
    """Each row's point as drawn: (the row, its style and its legend's label). The sweep's values
    along viridis, each its own shape; the rule in force a grey star, the edit an orange diamond,
    drawn last, on top. A point on the spot of one drawn before says so in its label."""
    import matplotlib.pyplot as plt

    swept = [r for r in rows if r.get("role", "") in ("", "= in force")]
    marked = [r for r in rows if r.get("role") in ("in force", "edit")]
    out, spots = [], {}
    for k, r in enumerate(swept):
        name = f"{r['value']}" + (" (= in force)" if r.get("role") == "= in force" else "")
        colour = plt.get_cmap("viridis")(k / max(1, len(swept) - 1))
        style = {"marker": MARKERS[k % len(MARKERS)], "markersize": 8, "color": colour, "alpha": 0.85, "zorder": 2}
        out.append((r, style, name))
    for r in marked:
        force = r["role"] == "in force"
        style = {"marker": "*" if force else "d", "markersize": 16 if force else 12, "zorder": 3,
                 "markeredgecolor": "white", "color": IN_FORCE_COLOUR if force else EDIT_COLOUR}  # fmt: skip
        out.append((r, style, f"{'in force' if force else 'the edit'} ({r['value'] or 'as written'})"))
    labelled = []
    for r, style, name in out:
        first = spots.setdefault((_fa(r), r["median"], _share(r)), name.split(" (")[0])
        on = "" if first == name.split(" (")[0] else f", on {first}'s point"
        labelled.append((r, {**style, "label": name + on}))
    return labelled


def figure(rows: list[dict], sweep: Sweep) -> Any:
    """The trade-off: median delay after the onset, and the share of incident runs caught,
    against false alarms per 100 run-hours, one point per value. Every point is named in the
    legend beside the panels, never by a label on the plot: values that trade the same sit on
    one spot (2.5, 3, 4 and 5 at no false alarm and 2 steps), where labels printed on top of
    one another. Returns the matplotlib Figure (plot() writes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    what = "threshold" if sweep.field == "threshold" else "for:"
    points = _points(rows)
    line = [r for r, _ in points if r.get("role", "") in ("", "= in force")]
    for ax, y, label in ((axes[0], _median, "median steps from the onset to the first fire"),
                         (axes[1], _share, "% of the incident runs caught")):  # fmt: skip
        ax.plot([_fa(r) for r in line], [y(r) for r in line], "-", color="#bbbbbb", zorder=1)
        for r, style in points:
            ax.plot([_fa(r)], [y(r)], linestyle="none", **style)
        ax.set_xlabel("false alarms per 100 run-hours (runs it should stay silent in)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    right = 0.8 - 0.12 * (len(labels) // 18)  # the legend's columns, beside the panels
    fig.legend(handles, labels, title=what, loc="center left", bbox_to_anchor=(right + 0.005, 0.5), fontsize=8,
               ncol=1 + len(labels) // 18)  # fmt: skip
    fig.suptitle(f"{sweep.alert}: what each {what} trades", fontsize=11)
    fig.tight_layout(rect=(0, 0, right, 1))
    return fig


def plot(rows: list[dict], sweep: Sweep, path: Path) -> None:
    """figure(), written to path as a PNG, atomically."""
    fig = figure(rows, sweep)  # first: it sets matplotlib's backend before pyplot is imported
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_atomic(path, buf.getvalue())

"""The rule workbench's readouts: what each alert catches at each size of incident, and what one
alert trades at each value of its threshold or its `for:`.

    runwatch backtest --strengths 0.05-1 --sweep TrainingLossJump=2,2.5,3,4,5 --plot sweep.png
    runwatch backtest --strengths 0.05-1 --sweep HeldOutGap.for=0s,5s,10s,20s

A sweep value is a variant of the alert (variants.py), evaluated in Prometheus beside the rules
in force, on the same runs. Nothing here decides whether an alert fired: it renames, counts and
draws what Prometheus said.

Per value, a sweep reports the runs caught in each incident the plate says the alert catches
(first fire at or after the onset), by strength band; the median and worst delay after the onset
(steps; a fault's, seconds after it); and false alarms per hundred run-hours: each time the
alert began to fire in a run where the plate says it stays silent (healthy runs and the
incidents it should not page on), over those runs' lab hours.

A report of the evaluation's Result, beside report.py: it imports the stages, none imports it
but the command.
"""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Any

from runwatch.backtest import signatures
from runwatch.backtest.evaluate import Result
from runwatch.backtest.plan import Strengths
from runwatch.backtest.variants import IN_FORCE, Sweep, same
from runwatch.core.files import write_atomic
from runwatch.trainer.config import TrainConfig

ONSET = TrainConfig().onset  # the backtest's runs all start their incident here
HOUR = 3600.0


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
    rows += [(sweep.name(v), v, "= in force" if same(v, forced, sweep) else "") for v in sweep.values]
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

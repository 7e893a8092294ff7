"""The report of `runwatch backtest --from-prometheus`: each alert's pages on the recorded
history, what it caught of the incidents overlaid, and a sweep's rows. It counts and lays out
the instants Prometheus said each alert fired (runwatch.backtest.recorded); it decides nothing.
"""

from __future__ import annotations

import math
import statistics

from runwatch.backtest import variants
from runwatch.backtest.overlay import HORIZON_S, Injection, Run


def episodes(times: list[int]) -> list[int]:
    """The instants at which each unbroken stretch of firing began: a page each."""
    return [t for i, t in enumerate(times) if i == 0 or t - times[i - 1] > 1]


def false_alarms(runs: list[Run], fired: dict, step_at: dict, alerts: list[str]) -> dict:
    """Per alert: its pages on the untouched runs, where, and per hour of their history."""
    hours = sum(r.hours for r in runs)
    out = {}
    for alert in alerts:
        pages = [(r.run_id, step_at.get(r.run_id, {}).get(t)) for r in runs
                 for t in episodes(fired[r.run_id].get(alert, []))]  # fmt: skip
        out[alert] = {"pages": len(pages), "per_hour": round(len(pages) / hours, 2) if hours else None,
                      "runs_paged": len({r for r, _ in pages}), "runs": len(runs), "at": pages}  # fmt: skip
    return out


def catches(copies: list[Run], fired: dict, step_at: dict, alerts: list[str]) -> dict:
    """Per injection and alert: the copies whose alert fired within HORIZON_S of the onset at an
    instant the untouched run did not, and the delay to the first such instant, in steps."""
    out: dict = {}
    for c in copies:
        onset = math.ceil(c.onset_ms / 1000)  # the first grid instant that reads the onset's sample
        for alert in alerts:
            theirs = set(fired[c.source].get(alert, []))
            own = [t for t in fired[c.run_id].get(alert, []) if onset <= t <= onset + HORIZON_S and t not in theirs]
            cell = out.setdefault(c.injection.name, {}).setdefault(alert, {"caught": 0, "copies": 0, "delays": []})
            cell["copies"] += 1
            if own:
                cell["caught"] += 1
                step = step_at.get(c.run_id, {}).get(own[0], c.onset_step)
                cell["delays"].append({"steps": step - c.onset_step, "seconds": own[0] - c.onset_ms / 1000})
    for per_alert in out.values():
        for cell in per_alert.values():
            steps = [d["steps"] for d in cell["delays"]]
            secs = [d["seconds"] for d in cell["delays"]]
            cell["median_steps"] = statistics.median(steps) if steps else None
            cell["worst_steps"] = max(steps) if steps else None
            cell["median_seconds"] = round(statistics.median(secs), 1) if secs else None
    return out


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[j]) for r in rows) + 2 for j in range(len(rows[0]))]
    return ["".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def report(found: dict, alerts: list[str], injections: list[Injection]) -> str:
    fa, caught = found["false_alarms"], found.get("catches", {})
    lines = ["pages on your runs' own history, nothing injected (false alarms, if the runs were healthy):", ""]
    rows = [["alert", "pages", "per hour", "runs paged", "at (run: step)"]]
    for alert in alerts:
        c = fa[alert]
        at = ", ".join(f"{r}: {s}" for r, s in c["at"][:5]) + (" ..." if len(c["at"]) > 5 else "")
        rows.append([alert, str(c["pages"]), _n(c["per_hour"]), f"{c['runs_paged']}/{c['runs']}", at or "-"])
    lines += _columns(rows)
    if caught:
        lines += ["", f"injected incidents: caught when the alert fires within {HORIZON_S} s of the onset, at an "
                  "instant the untouched run does not; delay in your run's steps", ""]  # fmt: skip
        rows = [["incident", "alert", "caught", "delay median", "worst", "median seconds"]]
        for inj in injections:
            for alert in alerts:
                c = caught[inj.name][alert]
                if alert != inj.alert and not c["caught"]:
                    continue  # an alert that catches nothing of an incident not its own: not a row
                mark = " *" if alert == inj.alert else ""
                rows.append([inj.name, alert + mark, f"{c['caught']}/{c['copies']}", _n(c["median_steps"]),
                             _n(c["worst_steps"]), _n(c["median_seconds"])])  # fmt: skip
        lines += _columns(rows)
        lines.append("(* the alert the plate pages this incident with)")
    return "\n".join(lines)


def sweep_report(found: dict, swept: variants.Sweep, current: str | None, injections: list[Injection]) -> str:
    """One row per swept value: its false alarms on the history, and what it catches of each injection."""
    head = ["value", "pages", "per hour"]
    for inj in injections:
        head += [f"{inj.name} caught", "delay"]
    rows = [head]
    written = f"{current} *" if current is not None else "as written *"  # the rule as --rules write it
    for value, name in [(written, swept.alert), *zip(swept.values, swept.names, strict=True)]:
        c = found["false_alarms"][name]
        row = [value, str(c["pages"]), _n(c["per_hour"])]
        for inj in injections:
            k = found.get("catches", {}).get(inj.name, {}).get(name)
            row += [f"{k['caught']}/{k['copies']}", _n(k["median_steps"])] if k else ["-", "-"]
        rows.append(row)
    field = "threshold" if swept.field == "threshold" else "for:"
    title = f"{swept.alert}'s {field} swept over your runs (* the rules' own, first)"
    return "\n".join([title, "", *_columns(rows)])

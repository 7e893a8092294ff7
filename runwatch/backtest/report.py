"""Stage 5 of the backtest: the runs' readouts read against the plate.

    summary = summarise(result)
    print(report(summary, result.alerts))

Per incident and alert: how many runs fired and where (median, range), the plate's readout
beside it, the signatures matched, false alarms, off steps and misses, how far other alerts
lead TrainingLossJump, and for a cluster whether a rank alert named the struck rank.

The last stage: it imports the ones before it (the plan's incidents, the evaluation's Result).
"""

from __future__ import annotations

import statistics

from runwatch.backtest import signatures
from runwatch.backtest.evaluate import Result
from runwatch.backtest.plan import ALL_INCIDENTS
from runwatch.core.names import CLUSTER_ALERTS, LOSS_ALERT, RANK_ALERTS, TARGET_ALERTS
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.run import struck_rank


def readout(run: dict, alert: str) -> float | None:
    """When an alert first fired in a run: its step, or for a fault, seconds from the fault."""
    return run["after_fault"][alert] if "after_fault" in run else run["first_fire"][alert]


def summarise(result: Result) -> dict:
    """Per incident and alert: how many runs fired and where; signature matches; false alarms."""
    summary: dict = {
        "incidents": {},
        "false_alarms": [],  # fired where the plate says the alert stays silent
        "off_steps": [],  # fired, but outside the plate's steps
        "missed": [],  # never fired where the plate says it does
        "unattributed_firings": result.unattributed,
    }
    for incident in ALL_INCIDENTS:
        runs = [r for r in result.runs if r["incident"] == incident]
        if not runs:
            continue
        cells = {}
        for alert in result.alerts:
            steps = [readout(r, alert) for r in runs if readout(r, alert) is not None]
            expect = signatures.expectation(incident, alert)
            cells[alert] = {
                "fired": len(steps),
                "runs": len(runs),
                "median": statistics.median(steps) if steps else None,
                "min": min(steps) if steps else None,
                "max": max(steps) if steps else None,
                "plate": signatures.PLATE_READOUTS.get(incident, {}).get(alert),
                "expect": expect.describe() if expect else None,
                "met": sum(expect.met(readout(r, alert)) for r in runs) if expect else None,
            }
        matched = sum(
            all(e.met(readout(r, a)) for a, e in signatures.signature(incident).items() if a in result.alerts)
            and all(r["first_fire"][a] is None for a in result.alerts if incident == "none")
            for r in runs
        )
        summary["incidents"][incident] = {"runs": len(runs), "signature_matched": matched, "alerts": cells}
        if incident in signatures.CLUSTER_INCIDENTS and incident not in signatures.FAULTS:  # a straggler's rank
            summary["incidents"][incident]["named_right_rank"] = named_right_rank(result, runs)
        for r in runs:
            for alert in r["first_fire"]:
                step, expect = readout(r, alert), signatures.expectation(incident, alert)
                if expect is None or expect.met(step):
                    continue
                kind = "missed" if step is None else "off_steps" if expect.fires else "false_alarms"
                summary[kind].append(
                    {
                        "incident": incident,
                        "seed": r["seed"],
                        "alert": alert,
                        "step": step,
                        "expected": expect.describe(),
                    }
                )
    summary["lead_over_loss_alert"] = leads(result)
    summary["seconds"] = {k: round(v, 1) for k, v in result.seconds.items()}
    summary["samples"] = result.samples
    return summary


def named_right_rank(result: Result, runs: list[dict]) -> dict[str, int]:
    """Per alert that names a rank: in how many of a cluster incident's runs it first fired
    naming the rank the incident struck, and only that rank."""
    out = {}
    for alert in RANK_ALERTS:
        if alert in result.alerts:
            struck = [str(struck_rank(TrainConfig(seed=r["seed"], incident=r["incident"], ranks=result.ranks)))
                      for r in runs]  # fmt: skip
            out[alert] = sum(r.get("named_ranks", {}).get(alert) == [s] for r, s in zip(runs, struck, strict=True))
    return out


def leads(result: Result) -> dict:
    """For alerts the plate does not name: in each incident, how many steps before
    TrainingLossJump they first fired (negative: after), over runs where both fired."""
    out: dict = {}
    others = [a for a in result.alerts if a not in (*signatures.ALERTS, *CLUSTER_ALERTS, *TARGET_ALERTS)]
    for incident in (i for i in ALL_INCIDENTS if i not in signatures.FAULTS):  # a fault's readouts are not steps
        runs = [r for r in result.runs if r["incident"] == incident]
        for alert in others:
            both = [r for r in runs if r["first_fire"][alert] is not None and r["first_fire"][LOSS_ALERT] is not None]
            fired = sum(r["first_fire"][alert] is not None for r in runs)
            if not fired:
                continue
            lead = [r["first_fire"][LOSS_ALERT] - r["first_fire"][alert] for r in both]
            out.setdefault(incident, {})[alert] = {
                "fired": fired,
                "runs": len(runs),
                "median_lead": statistics.median(lead) if lead else None,
                "min_lead": min(lead) if lead else None,
                "max_lead": max(lead) if lead else None,
            }
    return out


def _cell(c: dict, target: bool = False) -> str:
    if not c["fired"]:
        ours = "-"
    elif c["min"] == c["max"]:
        ours = f"{c['median']:g}"
    else:
        ours = f"{c['median']:g} ({c['min']}-{c['max']})"
    if c["fired"] not in (0, c["runs"]):
        ours += f" {c['fired']}/{c['runs']}"
    if target:  # a fault's target, in seconds: "10-15", or "silent"
        plate_ = (c["expect"] or "-").removeprefix("fires in ").removeprefix("fires at ")
    else:
        plate_ = "-" if c["plate"] is None else str(c["plate"])
    return f"{ours} [{plate_}]"


def _table(title: str, incidents: dict, alerts: list[str], target: bool) -> list[str]:
    cells = {i: [_cell(inc["alerts"][a], target) for a in alerts] for i, inc in incidents.items()}
    # each column as wide as its widest cell, and two spaces between columns whatever they hold
    widths = [max(len(a), *(len(row[j]) for row in cells.values())) + 2 for j, a in enumerate(alerts)]
    lines = [title, ""]
    lines.append("incident".ljust(16) + "".join(a.ljust(w) for a, w in zip(alerts, widths, strict=True)) + "signature")
    for incident, inc in incidents.items():
        row = incident.ljust(16) + "".join(c.ljust(w) for c, w in zip(cells[incident], widths, strict=True))
        lines.append(row + f"{inc['signature_matched']}/{inc['runs']}")
    return lines + [""]


def _when(finding: dict) -> str:
    if finding["step"] is None:
        return "never"
    if finding["incident"] in signatures.FAULTS:
        return f"{finding['step']} s after the fault"
    return f"at step {finding['step']}"


def report(summary: dict, alerts: list[str]) -> str:
    """The readout table: first-fire step, median (range) over seeds, the plate's in brackets;
    for the faults, a second table in seconds from the fault, the target in brackets."""
    steps = {i: inc for i, inc in summary["incidents"].items() if i not in signatures.FAULTS}
    faults = {i: inc for i, inc in summary["incidents"].items() if i in signatures.FAULTS}
    lines = _table("first-fire step: median (min-max) over seeds [the plate's readout]", steps, alerts, False)
    if faults:
        title = "seconds from the fault to the first fire: median (min-max) over seeds [the target]"
        lines += _table(title, faults, alerts, True)
    for kind, title in [
        ("false_alarms", "false alarms (fired where the plate says silent)"),
        ("off_steps", "off the plate's steps"),
        ("missed", "missed (never fired where the plate says it does)"),
    ]:
        found = summary[kind]
        lines.append(f"{title}: {len(found)}")
        lines += [f"  {f['incident']} seed {f['seed']}: {f['alert']} {_when(f)} ({f['expected']})" for f in found]
    lead = summary.get("lead_over_loss_alert", {})
    if lead:
        lines.append("steps before TrainingLossJump that the other alerts first fire (negative: after):")
        for incident, alerts in lead.items():
            for alert, c in alerts.items():
                spread = "" if c["min_lead"] == c["max_lead"] else f" ({c['min_lead']} to {c['max_lead']})"
                lines.append(
                    f"  {incident:15s} {alert:20s} median {c['median_lead']}{spread}, fired in {c['fired']}/{c['runs']}"
                )
    for incident, inc in summary["incidents"].items():
        for alert, n in inc.get("named_right_rank", {}).items():
            lines.append(f"{incident}: {alert} named the struck rank, and only it, in {n}/{inc['runs']} runs")
    for alert, n in summary["unattributed_firings"].items():
        lines.append(f"  {alert}: {n} firing series carry no run_id or instance (rule aggregates them away)")
    return "\n".join(lines)

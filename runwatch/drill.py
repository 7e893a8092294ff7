"""On-call practice: `runwatch drill | ack | diagnose | postmortem`, one learner at a keyboard.

A drill is Google's "Wheel of Misfortune" with the game master replaced by a sealed file:

    runwatch drill --fast-forward 200      # a native lab whose trainer runs a hidden incident (or none)
    runwatch pager --follow                # pages arrive; each names its runbook
    runwatch ack HeldOutGap --comment "looking: train loss far below held-out"
    runwatch diagnose repeated_batch --step 300
    runwatch postmortem                    # postmortem-<run>.md, with the timeline and the plate

The incident and its onset (random in 240-360) are sealed in the run's directory; nothing on
/metrics, the dashboards or the pages names them. An ack is what on-call tools built on
Alertmanager do: a silence scoped to that alert and run, with an expiry and the comment.
Everything the drill records lives in the lab's state directory: drill.json for this drill,
scoreboard.jsonl across drills.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests

from oncall.pager import read_pages
from runwatch import lab as lab_mod
from runwatch import plate
from runwatch.command import Command, UsageError, add_state_dir, check_writable
from runwatch.files import write_atomic
from runwatch.names import url
from runwatch.promserver import instant
from trainer.config import DRILL_ONSET_RANGE, INCIDENTS
from trainer.sealed import unseal

PROMETHEUS = url("prometheus")
ALERTMANAGER = url("alertmanager")


def _now() -> float:
    return time.time()


def _iso(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Drill:
    """drill.json in a lab's state directory: the run, its acks and its diagnosis."""

    def __init__(self, state: Path):
        self.lab = lab_mod.Lab(state)
        self.path = self.lab.state / "drill.json"

    def load(self) -> dict:
        if not self.path.exists():
            raise UsageError(f"no drill in {self.lab.state}: start one with `runwatch drill`")
        return json.loads(self.path.read_text())

    def save(self, record: dict) -> None:
        write_atomic(self.path, json.dumps(record, indent=2) + "\n")

    def answer(self, record: dict) -> dict:
        return unseal(self.lab.runs / record["run_id"] / "answer.sealed")


# --- runwatch drill ---


def drill(args: argparse.Namespace) -> int:
    d = Drill(args.state_dir)
    if d.path.exists() and json.loads(d.path.read_text()).get("diagnosis") is None:
        running = [n for n, r in d.lab.records().items() if d.lab.alive(r)]
        if running:
            raise UsageError(f"a drill is already running in {d.lab.state}: `runwatch diagnose` it, or `runwatch down`")
    if args.fast_forward >= DRILL_ONSET_RANGE[0]:
        raise UsageError(
            f"--fast-forward: must be below {DRILL_ONSET_RANGE[0]}, the earliest drill onset, got {args.fast_forward}"
        )
    up_args = argparse.Namespace(
        state_dir=args.state_dir, incident="random", seed=args.seed if args.seed is not None else 0, onset=None,
        fast_forward=args.fast_forward, control=False, detach=True, drill_seed=args.seed, root=None, precision="fp64",
    )  # fmt: skip
    lab_mod.up(up_args)
    run_id = json.loads((d.lab.state / "lab.json").read_text())["run_id"]
    d.save({"run_id": run_id, "started_at": _now(), "acks": [], "diagnosis": None})
    print(f"drill {run_id} started: something may go wrong between steps {DRILL_ONSET_RANGE[0]} and "
          f"{DRILL_ONSET_RANGE[1]}, or nothing at all.")  # fmt: skip
    print("watch `runwatch pager --follow`; then `runwatch ack ALERT`, `runwatch diagnose INCIDENT`")
    return 0


# --- runwatch ack ---


def firing_in_alertmanager(alert: str, run_id: str) -> list[dict]:
    params = {"filter": [f'alertname="{alert}"', f'run_id="{run_id}"'], "active": "true", "silenced": "false"}
    resp = requests.get(f"{ALERTMANAGER}/api/v2/alerts", params=params, timeout=5)
    resp.raise_for_status()
    return resp.json()


def ack(args: argparse.Namespace) -> int:
    if not args.expires > 0:
        raise UsageError(f"--expires: a silence must last more than 0 minutes, got {args.expires:g}")
    d = Drill(args.state_dir)
    record = d.load()
    run_id = record["run_id"]
    try:
        if not firing_in_alertmanager(args.alert, run_id):
            raise UsageError(f"ack: {args.alert} is not firing for run {run_id} (see `runwatch pager`)")
        now = datetime.now(UTC)
        silence = {
            "matchers": [
                {"name": "alertname", "value": args.alert, "isRegex": False, "isEqual": True},
                {"name": "run_id", "value": run_id, "isRegex": False, "isEqual": True},
            ],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=args.expires)).isoformat(),
            "createdBy": "runwatch ack",
            "comment": args.comment or f"acknowledged {args.alert}",
        }
        resp = requests.post(f"{ALERTMANAGER}/api/v2/silences", json=silence, timeout=5)
        resp.raise_for_status()
    except requests.RequestException as err:
        raise UsageError(f"ack: Alertmanager at {ALERTMANAGER} did not answer ({type(err).__name__})") from None
    silence_id = resp.json()["silenceID"]
    record["acks"].append({"alert": args.alert, "at": _now(), "comment": silence["comment"], "silence": silence_id})
    d.save(record)
    print(
        f"acknowledged {args.alert} for run {run_id}: silence {silence_id} "
        f"until {_iso(now.timestamp() + 60 * args.expires)}"
    )
    return 0


# --- runwatch diagnose ---


def onset_time(run_id: str, onset: int, since: float) -> float | None:
    """When the trainer's onset step was first scraped: read from Prometheus."""
    window = int(_now() - since) + 60
    step = f'runwatch_train_step{{run_id="{run_id}"}}'
    # timestamp() of the plain selector is the scrape's time; of `step >= onset` it would be the
    # evaluation's, up to a second later
    q = f"min_over_time((timestamp({step}) and {step} >= {onset})[{window}s:1s])"
    found = instant(PROMETHEUS, q)
    return float(found[0]["value"][1]) if found else None


def first_page(lab: lab_mod.Lab, run_id: str) -> dict | None:
    pages = [p for p in read_pages(lab.page_log) if p["run_id"] == run_id and p["status"] == "firing"]
    return pages[0] if pages else None


def _t(page: dict | None) -> float | None:
    return None if page is None else datetime.fromisoformat(page["received_at"].replace("Z", "+00:00")).timestamp()


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 1)


def diagnose(args: argparse.Namespace) -> int:
    if args.incident not in INCIDENTS:
        raise UsageError(f"diagnose: unknown incident {args.incident!r}; choose one of {', '.join(INCIDENTS)}")
    d = Drill(args.state_dir)
    record = d.load()
    if record["diagnosis"] is not None:
        raise UsageError(
            f"diagnose: drill {record['run_id']} was already diagnosed as {record['diagnosis']['incident']}"
        )
    truth = d.answer(record)
    now = _now()
    page = first_page(d.lab, record["run_id"])
    paged_at = _t(page)
    onset_at = (
        onset_time(record["run_id"], truth["onset"], record["started_at"]) if truth["incident"] != "none" else None
    )
    acked = min((a["at"] for a in record["acks"]), default=None)
    grade = {
        "run_id": record["run_id"],
        "incident": truth["incident"],
        "onset": truth["onset"] if truth["incident"] != "none" else None,
        "diagnosed": args.incident,
        "correct": args.incident == truth["incident"],
        "false_incident": truth["incident"] == "none" and args.incident != "none",
        "step_guess": args.step,
        "step_error": None if args.step is None or truth["incident"] == "none" else args.step - truth["onset"],
        "first_page": page["alert"] if page else None,
        "onset_to_first_page_s": _delta(onset_at, paged_at),
        "first_page_to_ack_s": _delta(paged_at, acked),
        "first_page_to_diagnosis_s": _delta(paged_at, now),
        "diagnosed_at": now,
    }
    record["diagnosis"] = {"incident": args.incident, "step": args.step, "at": now, "onset_at": onset_at}
    record["grade"] = grade
    d.save(record)
    with open(d.lab.state / "scoreboard.jsonl", "a") as fh:
        fh.write(json.dumps(grade) + "\n")
    print(report(grade))
    print(scoreboard_line(d.lab.state / "scoreboard.jsonl"))
    return 0


def report(g: dict) -> str:
    verdict = "CORRECT" if g["correct"] else "WRONG"
    truth = g["incident"] + ("" if g["onset"] is None else f" from step {g['onset']}")
    lines = [f"{verdict}: you said {g['diagnosed']}; it was {truth}."]
    if g["false_incident"]:
        lines.append("The run was healthy: declaring an incident here is a false alarm of your own.")
    if g["step_error"] is not None:
        lines.append(f"your onset step was {g['step_error']:+d} steps off")

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} s"

    lines.append(
        f"onset -> first page: {s(g['onset_to_first_page_s'])} ({g['first_page'] or 'no page'}); "
        f"first page -> ack: {s(g['first_page_to_ack_s'])}; "
        f"first page -> diagnosis: {s(g['first_page_to_diagnosis_s'])}"
    )
    return "\n".join(lines)


def scoreboard_line(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    right = sum(r["correct"] for r in rows)
    return f"scoreboard: {right}/{len(rows)} drills diagnosed correctly"


# --- runwatch postmortem ---


def postmortem(args: argparse.Namespace) -> int:
    d = Drill(args.state_dir)
    record = d.load()
    run_id = record["run_id"]
    grade = record.get("grade")
    if grade is None:
        raise UsageError(
            "postmortem: diagnose the drill first (`runwatch diagnose INCIDENT`): the timeline needs the truth"
        )
    out = args.out or Path(f"postmortem-{run_id}.md")
    check_writable(out, "--out")
    events = timeline(d, record, grade)
    image = out.with_name(f"{out.stem}-plate.png")
    try:
        plate.draw(plate.collect(PROMETHEUS, run_id, since_s=_now() - record["started_at"] + 60), image)
        plate_md = f"![The run, drawn by runwatch plate]({image.name})"
    except (UsageError, requests.RequestException) as err:
        plate_md = f"(no plate: {err})"
    write_atomic(out, postmortem_markdown(run_id, grade, events, plate_md))
    print(f"wrote {out} ({len(events)} timeline events)")
    return 0


def timeline(d: Drill, record: dict, grade: dict) -> list[tuple[float, str]]:
    """The drill's events, oldest first: start, onset, pages, acks, diagnosis, the run's end."""
    run_id = record["run_id"]
    events = [(record["started_at"], "Drill started (lab up, trainer running)")]
    if record["diagnosis"].get("onset_at"):
        events.append(
            (record["diagnosis"]["onset_at"], f"Incident began: {grade['incident']} at step {grade['onset']}")
        )
    for p in read_pages(d.lab.page_log):
        if p["run_id"] == run_id:
            what = "Page" if p["status"] == "firing" else "Resolved"
            events.append((_t(p), f"{what}: {p['alert']} (step {p['step'] or '-'}): {p['summary']}"))
    for a in record["acks"]:
        events.append((a["at"], f"Acknowledged {a['alert']}: {a['comment']}"))
    events.append(
        (record["diagnosis"]["at"], f"Diagnosed as {grade['diagnosed']} ({'correct' if grade['correct'] else 'wrong'})")
    )
    run_json = d.lab.runs / run_id / "run.json"
    ended = json.loads(run_json.read_text()).get("ended_at") if run_json.exists() else None
    if ended:
        events.append((datetime.fromisoformat(ended).timestamp(), "Run ended"))
    events.sort(key=lambda e: e[0])
    return events


def postmortem_markdown(run_id: str, grade: dict, events: list[tuple[float, str]], plate_md: str) -> str:
    """PagerDuty's postmortem sections, filled from the grade and the timeline."""
    impact = (
        "None: the run was healthy." if grade["incident"] == "none"
        else f"{grade['incident']} from step {grade['onset']}; first page "
        f"{grade['onset_to_first_page_s'] if grade['onset_to_first_page_s'] is not None else '-'} s after the onset."
    )  # fmt: skip
    md = [
        f"# Postmortem: drill {run_id}",
        "",
        "## Overview",
        f"A drill on the runwatch lab. The hidden incident was **{grade['incident']}**; it was diagnosed as "
        f"**{grade['diagnosed']}** ({'correct' if grade['correct'] else 'wrong'}).",
        "",
        "## What happened",
        f"First page: {grade['first_page'] or 'none'}. Onset to first page: {grade['onset_to_first_page_s']} s; "
        f"first page to ack: {grade['first_page_to_ack_s']} s; "
        f"first page to diagnosis: {grade['first_page_to_diagnosis_s']} s.",
        "",
        plate_md,
        "",
        "## Contributing factors",
        "_Fill in: what let this happen, and what made it harder to see?"
        " (Which signal showed it first? Which stayed quiet?)_",
        "",
        "## Resolution",
        "_Fill in: what you would do to recover (see the runbook of the first page)._",
        "",
        "## Impact",
        impact,
        "",
        "## Timeline",
        "| time (UTC) | event |",
        "|---|---|",
        *[f"| {_iso(t)} | {text} |" for t, text in events],
        "",
        "## Action items",
        "_Fill in: owner, action, due. Alert changes can be measured first with `runwatch backtest`._",
        "",
    ]
    return "\n".join(md)


# --- argument parsing ---


def add_drill(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--seed", type=int, default=None, help="make the drill reproducible (incident, onset, data)")
    p.add_argument("--fast-forward", type=int, default=0, metavar="STEP", help="skip ahead (below the earliest onset)")
    return drill


def add_ack(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("alert", help="the alert to acknowledge, e.g. TrainingLossJump")
    p.add_argument("--comment", default="", help="what you know so far")
    p.add_argument("--expires", type=float, default=30, metavar="MINUTES", help="silence length (default 30)")
    return ack


def add_diagnose(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("incident", help=f"your diagnosis: one of {', '.join(INCIDENTS)}")
    p.add_argument("--step", type=int, default=None, help="the step you think it began at")
    return diagnose


def add_postmortem(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--out", type=Path, default=None, help="Markdown file (default postmortem-RUN.md)")
    return postmortem

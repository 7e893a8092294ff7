"""`runwatch diagnose INCIDENT [--step N] [--rank R]`: name the drill's incident once; it is
revealed and graded against the sealed answer, with the drill's times (onset to first page,
first page to ack, first page to diagnosis), and the grade joins the scoreboard.
"""

from __future__ import annotations

import argparse
import json

import requests

from runwatch.core.command import Command, UsageError, add_state_dir, number
from runwatch.drill import coach
from runwatch.drill.confirm import first_page, received_at
from runwatch.drill.record import Drill, acked_at, now, scoreboard, scoreboard_line
from runwatch.oncall.page_log import read_incidents
from runwatch.prom.server import PromQLError, instant, quoted
from runwatch.trainer.config import CLUSTER_INCIDENTS, INCIDENTS, MAX_RANKS, STEP


def onset_time(prometheus: str, run_id: str, onset: int, since: float) -> float | None:
    """When the trainer's onset step was first scraped: read from Prometheus (None if it cannot say)."""
    window = int(now() - since) + 60
    step = f'runwatch_train_step{{run_id="{quoted(run_id)}"}}'
    # timestamp() of the plain selector is the scrape's time; of `step >= onset` it would be the
    # evaluation's, up to a second later
    q = f"min_over_time((timestamp({step}) and {step} >= {onset})[{window}s:1s])"
    try:
        found = instant(prometheus, q)
    except (requests.RequestException, PromQLError):
        return None
    return float(found[0]["value"][1]) if found else None


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 1)


def diagnose(args: argparse.Namespace) -> int:
    if args.incident not in INCIDENTS + CLUSTER_INCIDENTS:
        raise UsageError(
            f"unknown incident {args.incident!r}; choose one of {', '.join(INCIDENTS + CLUSTER_INCIDENTS)}"
        )
    d = Drill(args.state_dir)
    with d.locked():  # two diagnoses at once: the second waits, then finds the first's
        record = d.load()
        if record.get("diagnosis") is not None or d.graded(record["run_id"]):
            said = (record.get("diagnosis") or {}).get("incident", "before (see scoreboard.jsonl)")
            raise UsageError(f"drill {record['run_id']} was already diagnosed as {said}")
        grade = grade_drill(d, record, args.incident, args.step, args.rank)
        earlier = scoreboard(d.lab.state / "scoreboard.jsonl")
        # what the drill hid, for the console's plate, and the par its times are measured against
        grade["revealed"] = coach.windows(d.answer(record), int(record.get("ranks") or 1))
        par = coach.detection_par(grade["incident"], d.lab.layout)
        grade["par_onset_to_first_page_s"] = par and par[0]
        response = coach.response_par(grade["incident"], d.lab.layout)
        grade["par_first_page_to_ack_s"] = response and response["ack"][0]
        grade["par_first_page_to_diagnosis_s"] = response and response["diagnosis"][0]
        at, onset_at = grade["diagnosed_at"], grade.pop("onset_at")
        record["diagnosis"] = {"incident": args.incident, "step": args.step, "rank": args.rank, "at": at,
                               "onset_at": onset_at}  # fmt: skip
        record["grade"] = grade
        d.save(record)
        with open(d.lab.state / "scoreboard.jsonl", "a") as fh:
            fh.write(json.dumps(grade) + "\n")
    print(report(grade))
    print("\n".join(coach.coaching(grade, earlier, par, response)))
    print(scoreboard_line(d.lab.state / "scoreboard.jsonl"))
    return 0


def grade_drill(d: Drill, record: dict, diagnosed: str, step: int | None, rank: int | None = None) -> dict:
    """The grade of a diagnosis against the sealed answer, with the drill's times; a cluster
    incident's rank too, when the diagnosis names one."""
    truth = d.answer(record)
    at = now()
    page = first_page(d.lab, record["run_id"], record["started_at"])
    paged_at = received_at(page)
    healthy = truth["incident"] == "none"
    prometheus = d.lab.url("prometheus")
    onset_at = None if healthy else onset_time(prometheus, record["run_id"], truth["onset"], record["started_at"])
    # The first ack of any of the run's incidents, as the pager recorded it (the time to ack is
    # from the first page, whatever the alert did in between)
    acked = min((t for i in read_incidents(d.lab.page_log, record["run_id"]) if (t := acked_at(i))), default=None)
    return {
        "run_id": record["run_id"],
        "incident": truth["incident"],
        "onset": None if healthy else truth["onset"],
        "diagnosed": diagnosed,
        "correct": diagnosed == truth["incident"],
        "false_incident": healthy and diagnosed != "none",
        "step_guess": step,
        "step_error": None if step is None or healthy else step - truth["onset"],
        "strength": truth.get("strength"),  # a hard drill's weaker incident (None: the plate's)
        "rank": truth.get("rank"),  # the rank a cluster incident struck
        "rank_guess": rank,
        "rank_correct": None if rank is None or "rank" not in truth else rank == truth["rank"],
        "first_page": page["alert"] if page else None,
        "onset_to_first_page_s": _delta(onset_at, paged_at),
        "first_page_to_ack_s": _delta(paged_at, acked),
        "first_page_to_diagnosis_s": _delta(paged_at, at),
        "diagnosed_at": at,
        "onset_at": onset_at,
    }


def report(g: dict) -> str:
    verdict = "CORRECT" if g["correct"] else "WRONG"
    strength = f" at strength {g['strength']}" if g.get("strength") is not None else ""
    truth = g["incident"] + strength + ("" if g["onset"] is None else f" from step {g['onset']}")
    lines = [f"{verdict}: you said {g['diagnosed']}; it was {truth}."]
    if g["false_incident"]:
        lines.append("The run was healthy: declaring an incident here is a false alarm of your own.")
    if g["step_error"] is not None:
        lines.append(f"your onset step was {g['step_error']:+d} steps off")
    if g.get("rank_correct") is not None:
        lines.append(
            f"you named rank {g['rank_guess']}: {'right' if g['rank_correct'] else 'wrong'}, it was rank {g['rank']}"
        )
    elif g.get("rank_guess") is not None:
        lines.append(f"you named rank {g['rank_guess']}, but no single rank was struck")

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} s"

    lines.append(
        f"onset -> first page: {s(g['onset_to_first_page_s'])} ({g['first_page'] or 'no page'}); "
        f"first page -> ack: {s(g['first_page_to_ack_s'])}; "
        f"first page -> diagnosis: {s(g['first_page_to_diagnosis_s'])}"
    )
    return "\n".join(lines)


def add_diagnose(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("incident", help=f"your diagnosis: one of {', '.join(INCIDENTS + CLUSTER_INCIDENTS)}")
    p.add_argument("--step", type=STEP, default=None, help="the step you think it began at")
    p.add_argument(
        "--rank",
        type=number(int, 0, MAX_RANKS - 1),
        default=None,
        help="in a cluster drill, the rank you think was struck",
    )
    return diagnose

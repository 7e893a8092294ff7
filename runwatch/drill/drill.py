"""On-call practice: `runwatch drill | ack | diagnose | postmortem`, one learner at a keyboard.

A drill is Google's "Wheel of Misfortune" with the game master replaced by a sealed file:

    runwatch drill --fast-forward 200      # a native lab whose trainer runs a hidden incident (or none)
    runwatch pager --follow                # pages arrive; each names its runbook
    runwatch ack HeldOutGap --comment "looking: train loss far below held-out"
    runwatch diagnose repeated_batch --step 300
    runwatch postmortem                    # .runwatch/postmortem-<run>.md, with the timeline and the plate

The incident and its onset (random in 240-360) are sealed in the run's directory; nothing on
/metrics, the dashboards or the pages names them. An ack is what on-call tools built on
Alertmanager do: a silence scoped to that alert and run, with an expiry and the comment.
Everything the drill records lives in the lab's state directory: drill.json for this drill,
scoreboard.jsonl across drills.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import html
import json
import os
import re
import shlex
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests

from runwatch.core.command import Command, UsageError, add_state_dir, check_writable, number, read_json, state_flag
from runwatch.core.files import write_atomic
from runwatch.lab import supervise as lab_mod
from runwatch.oncall.pager import read_incidents, read_pages, received_time, time_to_ack
from runwatch.prom.server import PromQLError, instant, quoted
from runwatch.readouts import picture as plate
from runwatch.trainer.config import CLUSTER_INCIDENTS, DRILL_ONSET_RANGE, INCIDENTS, MAX_RANKS, SEED, STEP
from runwatch.trainer.sealed import unseal

MAX_SILENCE_MINUTES = 7 * 24 * 60


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
        record = read_json(self.path, "the drill's record")
        if not isinstance(record.get("run_id"), str) or not isinstance(record.get("acks"), list):
            raise UsageError(f"{self.path}: damaged (no run_id or acks); start a new drill with `runwatch drill`")
        return record

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the drill's lock: one ack or diagnosis at a time reads and rewrites drill.json."""
        if not self.path.exists():
            raise UsageError(f"no drill in {self.lab.state}: start one with `runwatch drill`")
        with self.lab.locked(wait=True, name="drill.lock"):
            yield

    def save(self, record: dict) -> None:
        write_atomic(self.path, json.dumps(record, indent=2) + "\n")

    def answer(self, record: dict) -> dict:
        try:
            return unseal(self.lab.sealed_answer(record["run_id"]))
        except FileNotFoundError:
            run_id = record["run_id"]
            raise UsageError(f"drill {run_id} has no sealed answer: was it started by `runwatch drill`?") from None
        except ValueError as err:
            raise UsageError(str(err)) from None

    def graded(self, run_id: str) -> bool:
        """Whether the scoreboard already holds a grade for this run (whatever drill.json says)."""
        return any(row.get("run_id") == run_id for row in scoreboard(self.lab.state / "scoreboard.jsonl"))


# --- runwatch drill ---


def drill(args: argparse.Namespace) -> int:
    d = Drill(args.state_dir)
    if d.path.exists() and read_json(d.path, "the drill's record").get("diagnosis") is None:
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
        ranks=args.ranks, ports=args.ports, no_wait_for_prometheus=False,  # a drill's incident must be seen
    )  # fmt: skip
    lab_mod.up(up_args)
    run_id = json.loads((d.lab.state / "lab.json").read_text())["run_id"]
    d.save({"run_id": run_id, "started_at": _now(), "acks": [], "diagnosis": None, "ranks": args.ranks})
    print(f"drill {run_id} started: something may go wrong between steps {DRILL_ONSET_RANGE[0]} and "
          f"{DRILL_ONSET_RANGE[1]}, or nothing at all.")  # fmt: skip
    at = state_flag(args.state_dir)  # every command as printed works, in any state directory
    print(f"watch `runwatch pager --follow --log {shlex.quote(str(d.lab.page_log))}`; then "
          f"`runwatch ack{at} ALERT --comment \"what you know so far\"`, `runwatch diagnose{at} INCIDENT`")  # fmt: skip
    return 0


# --- runwatch ack ---


def firing_unsilenced(alertmanager: str, alert: str, run_id: str) -> bool:
    """Whether Alertmanager holds the alert of the run firing with no silence: one an ack silences."""
    params = {"filter": [f'alertname="{alert}"', f'run_id="{run_id}"'], "active": "true", "silenced": "false"}
    try:
        resp = requests.get(f"{alertmanager}/api/v2/alerts", params=params, timeout=5)
        resp.raise_for_status()
        return bool(resp.json())
    except (requests.RequestException, ValueError) as err:
        raise UsageError(f"--alertmanager: {alertmanager} did not answer ({type(err).__name__})") from None


def ack(args: argparse.Namespace) -> int:
    """Acknowledge the incident of one alert of one run, with a comment: recorded by the pager
    (its page log, so the console, the drill's grade and the postmortem read it), whatever the
    alert is doing now. While the alert still fires, a silence scoped to it and the run keeps it
    quiet for --expires minutes, as tools built on Alertmanager acknowledge. The run: --run, else
    the lab's, else the drill's."""
    if not 0 < args.expires <= MAX_SILENCE_MINUTES:
        raise UsageError(f"--expires: minutes in (0, {MAX_SILENCE_MINUTES}] (a week at most), got {args.expires:g}")
    d = Drill(args.state_dir)
    run_id = args.run or _current_run(d)
    if not args.comment.strip():
        raise UsageError("--comment: say what you know so far; an ack records it with the incident")
    alertmanager = (args.alertmanager or d.lab.url("alertmanager")).rstrip("/")
    pager = (args.pager or d.lab.url("pager")).rstrip("/")
    incident = open_incident(pager, args.alert, run_id)
    silence_id = ""
    if incident["firing"] and firing_unsilenced(alertmanager, args.alert, run_id):
        silence_id = silence(alertmanager, args.alert, run_id, args.comment, args.expires)
    body = {"alert": args.alert, "run_id": run_id, "comment": args.comment, "by": args.by or _who(),
            "ack_id": uuid.uuid4().hex, "silence": silence_id}  # fmt: skip
    acked = _post_ack(pager, body)
    until = f"; silence {silence_id} until {_iso(_now() + 60 * args.expires)}" if silence_id else (
        "; its alert has resolved, so no silence is needed"
    )  # fmt: skip
    print(f"acknowledged {args.alert} for run {run_id}: incident {acked['state']}, "
          f"{_seconds(time_to_ack(acked))} after its first page{until}")  # fmt: skip
    if d.path.exists() and d.load()["run_id"] == run_id:  # the drill's record keeps its acks too
        with d.locked():
            record = d.load()
            record["acks"].append({"alert": args.alert, "at": _now(), "comment": args.comment, "silence": silence_id})
            d.save(record)
    return 0


def _who() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container's)
        return f"uid {os.getuid()}"


def open_incident(pager: str, alert: str, run_id: str) -> dict:
    """The run's incident of this alert, if it is open and unacknowledged; else a UsageError saying why."""
    try:
        resp = requests.get(f"{pager}/api/incidents", params={"run_id": run_id}, timeout=5)
        resp.raise_for_status()
        found = [i for i in resp.json()["incidents"] if i["alert"] == alert]
    except (requests.RequestException, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"--pager: {pager} did not answer ({type(err).__name__})") from None
    if not found:
        raise UsageError(f"{alert} has no incident for run {run_id}: it has not paged (see `runwatch pager`)")
    incident = found[0]
    if incident["acked_at"]:
        by, at = incident["acked_by"], incident["acked_at"][11:19]
        raise UsageError(f"{alert} of run {run_id} was already acknowledged by {by} at {at}")
    return incident


def _post_ack(pager: str, body: dict) -> dict:
    try:
        resp = requests.post(f"{pager}/api/ack", json=body, timeout=5)
        answer = resp.json()
    except (requests.RequestException, ValueError) as err:
        raise UsageError(f"--pager: {pager} did not answer ({type(err).__name__})") from None
    if resp.status_code != 200 or not isinstance(answer, dict) or "incident" not in answer:
        said = answer.get("error") if isinstance(answer, dict) else resp.reason
        raise UsageError(f"the pager refused the ack: {said}")
    return answer["incident"]


def _current_run(d: Drill) -> str:
    """The lab's run (its lab.json), else the drill's: what an ack without --run is about."""
    meta = d.lab.state / "lab.json"
    if meta.exists():
        record = read_json(meta, "the lab's record")
        if record.get("watch"):  # `up --watch`: the runs are the user's job's, and may be several
            raise UsageError(f"--run: the lab in {d.lab.state} watches a job of yours (up --watch): name its run")
        return str(record.get("run_id"))
    if d.path.exists():
        return d.load()["run_id"]
    raise UsageError(f"--run: no lab in {d.lab.state} to take the run from; name the run")


def silence(alertmanager: str, alert: str, run_id: str, comment: str, minutes: float) -> str:
    """Silence alert for run_id in Alertmanager for minutes, with the ack's comment; its id."""
    now = datetime.now(UTC)
    body = {
        "matchers": [
            {"name": "alertname", "value": alert, "isRegex": False, "isEqual": True},
            {"name": "run_id", "value": run_id, "isRegex": False, "isEqual": True},
        ],
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=minutes)).isoformat(),
        "createdBy": "runwatch ack",
        "comment": comment,
    }
    try:
        resp = requests.post(f"{alertmanager}/api/v2/silences", json=body, timeout=5)
        resp.raise_for_status()
        return str(resp.json()["silenceID"])
    except (requests.RequestException, ValueError, KeyError) as err:
        raise UsageError(f"--alertmanager: {alertmanager} did not answer ({type(err).__name__})") from None


# --- runwatch diagnose ---


def onset_time(prometheus: str, run_id: str, onset: int, since: float) -> float | None:
    """When the trainer's onset step was first scraped: read from Prometheus (None if it cannot say)."""
    window = int(_now() - since) + 60
    step = f'runwatch_train_step{{run_id="{quoted(run_id)}"}}'
    # timestamp() of the plain selector is the scrape's time; of `step >= onset` it would be the
    # evaluation's, up to a second later
    q = f"min_over_time((timestamp({step}) and {step} >= {onset})[{window}s:1s])"
    try:
        found = instant(prometheus, q)
    except (requests.RequestException, PromQLError):
        return None
    return float(found[0]["value"][1]) if found else None


ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


DURATION = re.compile(r"(\d+)(ms|s|m|h)")
RESEND_DELAY_S = 2  # Prometheus's --rules.alert.resend-delay in the lab (supervise.PROMETHEUS_FLAGS)


def notification_window_s(alertmanager_yml: Path) -> float:
    """The longest after an evaluation that has an alert firing that Alertmanager may send its
    page: the longest group_wait plus the longest group_interval of its routes (alertmanager.yml;
    group_interval is also when it retries a page the pager did not take), plus Prometheus's
    resend delay. A page that arrives later than this after its alert last fired was not sent for it.
    """
    import yaml

    def seconds(text: object) -> float:
        return sum(int(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in DURATION.findall(str(text)))

    def routes(route: dict, inherited: dict) -> Iterator[dict]:
        """Each route with the timings it has: its own, else its parent's (as Alertmanager reads them)."""
        own = {**inherited, **{k: route[k] for k in ("group_wait", "group_interval") if k in route}}
        yield own
        for child in route.get("routes") or []:
            yield from routes(child, own)

    defaults = {"group_wait": "30s", "group_interval": "5m"}  # Alertmanager's
    try:
        every = list(routes(yaml.safe_load(Path(alertmanager_yml).read_text())["route"], defaults))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        every = [defaults]
    wait = max(seconds(r["group_wait"]) for r in every)
    interval = max(seconds(r["group_interval"]) for r in every)
    return wait + interval + RESEND_DELAY_S


def fired_in_prometheus(prometheus: str, page: dict, run_id: str, window: float) -> bool:
    """Whether Prometheus's own record (ALERTS) has this page's alert firing for the run within
    `window` seconds (notification_window_s) before the page arrived. Any local process can post
    to the pager; only Prometheus's rules make ALERTS, so a page without it, or one posted after
    its alert stopped firing, is not counted (not an alert decision: Prometheus made it)."""
    received = _t(page)
    if received is None or not ALERT_NAME.fullmatch(str(page.get("alert", ""))):
        return False
    at = received + 2  # ALERTS is written when the alert fires, before the notification
    selector = f'ALERTS{{alertname="{page["alert"]}",run_id="{quoted(run_id)}",alertstate="firing"}}'
    try:
        return bool(instant(prometheus, f"count_over_time({selector}[{int(window) + 2}s])", at))
    except (requests.RequestException, PromQLError):
        return False


def first_page(lab: lab_mod.Lab, run_id: str, since: float) -> dict | None:
    """The run's first firing page that Prometheus confirms."""
    for page in read_pages(lab.page_log):
        if page.get("run_id") != run_id or page.get("status") != "firing":
            continue
        if fired_in_prometheus(lab.url("prometheus"), page, run_id, notification_window_s(lab.alertmanager_yml)):
            return page
    return None


def _t(page: dict | None) -> float | None:
    return None if page is None else received_time(page)


def _acked_at(incident: dict) -> float | None:
    return received_time({"received_at": incident["acked_at"]}) if incident["acked_at"] else None


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
        at, onset_at = grade["diagnosed_at"], grade.pop("onset_at")
        record["diagnosis"] = {"incident": args.incident, "step": args.step, "rank": args.rank, "at": at,
                               "onset_at": onset_at}  # fmt: skip
        record["grade"] = grade
        d.save(record)
        with open(d.lab.state / "scoreboard.jsonl", "a") as fh:
            fh.write(json.dumps(grade) + "\n")
    print(report(grade))
    print(scoreboard_line(d.lab.state / "scoreboard.jsonl"))
    return 0


def grade_drill(d: Drill, record: dict, diagnosed: str, step: int | None, rank: int | None = None) -> dict:
    """The grade of a diagnosis against the sealed answer, with the drill's times; a cluster
    incident's rank too, when the diagnosis names one."""
    truth = d.answer(record)
    now = _now()
    page = first_page(d.lab, record["run_id"], record["started_at"])
    paged_at = _t(page)
    healthy = truth["incident"] == "none"
    prometheus = d.lab.url("prometheus")
    onset_at = None if healthy else onset_time(prometheus, record["run_id"], truth["onset"], record["started_at"])
    # The first ack of any of the run's incidents, as the pager recorded it (the time to ack is
    # from the first page, whatever the alert did in between)
    acked = min((t for i in read_incidents(d.lab.page_log, record["run_id"]) if (t := _acked_at(i))), default=None)
    return {
        "run_id": record["run_id"],
        "incident": truth["incident"],
        "onset": None if healthy else truth["onset"],
        "diagnosed": diagnosed,
        "correct": diagnosed == truth["incident"],
        "false_incident": healthy and diagnosed != "none",
        "step_guess": step,
        "step_error": None if step is None or healthy else step - truth["onset"],
        "rank": truth.get("rank"),  # the rank a cluster incident struck
        "rank_guess": rank,
        "rank_correct": None if rank is None or "rank" not in truth else rank == truth["rank"],
        "first_page": page["alert"] if page else None,
        "onset_to_first_page_s": _delta(onset_at, paged_at),
        "first_page_to_ack_s": _delta(paged_at, acked),
        "first_page_to_diagnosis_s": _delta(paged_at, now),
        "diagnosed_at": now,
        "onset_at": onset_at,
    }


def report(g: dict) -> str:
    verdict = "CORRECT" if g["correct"] else "WRONG"
    truth = g["incident"] + ("" if g["onset"] is None else f" from step {g['onset']}")
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


def scoreboard(path: Path) -> list[dict]:
    """The graded drills, oldest first; a line that is not a grade (torn, hand-edited) is skipped."""
    rows = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, RecursionError):  # torn, or nested too deeply
                row = json.loads(line)
                if isinstance(row, dict) and isinstance(row.get("correct"), bool):
                    rows.append(row)
    return rows


def scoreboard_line(path: Path) -> str:
    rows = scoreboard(path)
    return f"scoreboard: {sum(r['correct'] for r in rows)}/{len(rows)} drills diagnosed correctly"


# --- runwatch postmortem ---


def postmortem(args: argparse.Namespace) -> int:
    d = Drill(args.state_dir)
    record = d.load()
    run_id = record["run_id"]
    grade = record.get("grade")
    if grade is None:
        raise UsageError("diagnose the drill first (`runwatch diagnose INCIDENT`): the timeline needs the truth")
    out = args.out or d.lab.state / f"postmortem-{run_id}.md"  # beside the drill, not in a checkout
    check_writable(out, "--out")
    try:
        events = timeline(d, record, grade)
        postmortem_markdown(run_id, grade, events, "")  # the same record's shape, before the plate is drawn
    except (KeyError, TypeError, AttributeError, ValueError) as err:  # a hand-edited drill.json
        raise UsageError(f"{d.path}: the drill's record is damaged ({type(err).__name__}: {err})") from None
    image = out.with_name(f"{out.stem}-plate.png")
    try:
        plate.draw(plate.collect(d.lab.url("prometheus"), run_id, since_s=_now() - record["started_at"] + 60), image)
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
        if p.get("run_id") == run_id and _t(p) is not None:
            what = "Page" if p.get("status") == "firing" else "Resolved"
            if not fired_in_prometheus(
                d.lab.url("prometheus"), p, run_id, notification_window_s(d.lab.alertmanager_yml)
            ):
                what = f"Unconfirmed {what.lower()} (Prometheus was not firing this alert as it came)"
            value = p.get("value_at_resolution")
            measured = f", its rule measuring {value:.3g}" if isinstance(value, float) else ""
            events.append(
                (_t(p), f"{what}: {p.get('alert')} (step {p.get('step') or '-'}{measured}): {p.get('summary')}")
            )
    for incident in read_incidents(d.lab.page_log, run_id):
        if (at := _acked_at(incident)) is not None:
            after = time_to_ack(incident)
            events.append((at, f"Acknowledged {incident['alert']} by {incident['acked_by']}, "
                               f"{_seconds(after)} after its first page: {incident['comment']}"))  # fmt: skip
    events.append(
        (record["diagnosis"]["at"], f"Diagnosed as {grade['diagnosed']} ({'correct' if grade['correct'] else 'wrong'})")
    )
    run_json = d.lab.runs / run_id / "run.json"
    try:  # the trainer's record: damaged, the timeline goes without its end, and says why
        ended = read_json(run_json, "the run's record").get("ended_at") if run_json.exists() else None
        if ended:
            events.append((datetime.fromisoformat(str(ended)).timestamp(), "Run ended"))
    except (UsageError, ValueError) as err:
        print(f"runwatch postmortem: the timeline has no run end: {err}", file=sys.stderr)
    events.sort(key=lambda e: e[0])
    return events


# Inside a table cell only these act: code, emphasis, links, strikethrough and the cell's end
# (a heading, list or quote needs the start of a line, which a flattened cell never is).
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md_text(text: object) -> str:
    """Text from a page (any local process can post one) as inert Markdown on one line: HTML
    escaped, Markdown's inline punctuation backslash-escaped, control characters and newlines as
    spaces, so a summary cannot leave its table cell, start a heading, or inject a link or a tag.

    >>> md_text("a | b\\n## <b>x</b>")
    'a \\\\| b ## &lt;b&gt;x&lt;/b&gt;'
    """
    flat = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(flat, quote=False))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g} s"


def postmortem_markdown(run_id: str, grade: dict, events: list[tuple[float, str]], plate_md: str) -> str:
    """PagerDuty's postmortem sections, filled from the grade and the timeline."""
    impact = (
        "None: the run was healthy." if grade["incident"] == "none"
        else f"{grade['incident']} from step {grade['onset']}; first page "
        f"{_seconds(grade['onset_to_first_page_s'])} after the onset."
    )  # fmt: skip
    md = [
        f"# Postmortem: drill {run_id}",
        "",
        "## Overview",
        f"A drill on the runwatch lab. The hidden incident was **{grade['incident']}**; it was diagnosed as "
        f"**{grade['diagnosed']}** ({'correct' if grade['correct'] else 'wrong'}).",
        "",
        "## What happened",
        f"First page: {md_text(grade['first_page'] or 'none')}. "
        f"Onset to first page: {_seconds(grade['onset_to_first_page_s'])}; "
        f"first page to ack: {_seconds(grade['first_page_to_ack_s'])}; "
        f"first page to diagnosis: {_seconds(grade['first_page_to_diagnosis_s'])}.",
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
        *[f"| {_iso(t)} | {md_text(text)} |" for t, text in events],
        "",
        "## Action items",
        "_Fill in: owner, action, due. Alert changes can be measured first with `runwatch backtest`._",
        "",
    ]
    return "\n".join(md)


# --- argument parsing ---


def add_drill(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--seed", type=SEED, default=None, help="make the drill reproducible in this state dir")
    p.add_argument("--fast-forward", type=STEP, default=0, metavar="STEP", help="skip ahead (below the earliest onset)")
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=1,
        help="train over N ranks: half the drills then hide a cluster incident, drawn by Llama 3's shares",
    )  # fmt: skip
    lab_mod.add_ports(p)
    return drill


def add_ack(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("alert", help="the alert to acknowledge, e.g. TrainingLossJump")
    p.add_argument("--comment", default="", help="what you know so far (required: the incident records it)")
    p.add_argument("--by", default=None, help="who acknowledges (default: your user name)")
    p.add_argument("--expires", type=float, default=30, metavar="MINUTES", help="silence length (default 30)")
    p.add_argument("--run", default=None, help="the run whose incident to ack (default: the lab's, else the drill's)")
    p.add_argument("--alertmanager", default=None, metavar="URL",
                   help="Alertmanager to create the silence in (default: the lab's, from its state dir)")  # fmt: skip
    p.add_argument("--pager", default=None, metavar="URL",
                   help="the pager that records the ack (default: the lab's, from its state dir)")  # fmt: skip
    return ack


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


def add_postmortem(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("--out", type=Path, default=None, help="Markdown file (default STATE_DIR/postmortem-RUN.md)")
    return postmortem

"""`runwatch ack ALERT --comment TEXT`: acknowledge the incident of one alert of one run.

The pager records the ack (its page log, so the console, the drill's grade and the postmortem
read it), carrying the lab's token as Alertmanager's webhooks do. While the alert still fires,
a silence scoped to it and the run keeps it quiet, as tools built on Alertmanager acknowledge.
The console's Ack runs this command.
"""

from __future__ import annotations

import argparse
import getpass
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests

from runwatch.core import credentials
from runwatch.core.command import Command, UsageError, add_state_dir, read_json
from runwatch.core.token import bearer, read_token
from runwatch.drill.record import Drill, iso, now, seconds
from runwatch.lab import supervise as lab_mod
from runwatch.oncall.incidents import time_to_ack

MAX_SILENCE_MINUTES = 7 * 24 * 60


def firing_unsilenced(alertmanager: str, alert: str, run_id: str, auth: tuple[str, str] | None = None) -> bool:
    """Whether Alertmanager holds the alert of the run firing with no silence: one an ack silences."""
    params = {"filter": [f'alertname="{alert}"', f'run_id="{run_id}"'], "active": "true", "silenced": "false"}
    try:
        resp = requests.get(f"{alertmanager}/api/v2/alerts", params=params, timeout=5, auth=auth)
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
    token = ack_token(args.token_file, d.lab, pager)
    incident = open_incident(pager, args.alert, run_id)
    silence_id = ""
    # the lab's Alertmanager password (runwatch.core.credentials): compose's from its volume
    if args.alertmanager_password_file is not None:
        auth = credentials.from_file(args.alertmanager_password_file, "--alertmanager-password-file")
    else:
        auth = d.lab.auth("alertmanager")
    if incident["firing"] and firing_unsilenced(alertmanager, args.alert, run_id, auth):
        silence_id = silence(alertmanager, args.alert, run_id, args.comment, args.expires, auth)
    body = {"alert": args.alert, "run_id": run_id, "comment": args.comment, "by": args.by or _who(),
            "ack_id": uuid.uuid4().hex, "silence": silence_id}  # fmt: skip
    acked = _post_ack(pager, body, token)
    until = f"; silence {silence_id} until {iso(now() + 60 * args.expires)}" if silence_id else (
        "; its alert has resolved, so no silence is needed"
    )  # fmt: skip
    print(f"acknowledged {args.alert} for run {run_id}: incident {acked['state']}, "
          f"{seconds(time_to_ack(acked))} after its first page{until}")  # fmt: skip
    if d.path.exists() and d.load()["run_id"] == run_id:  # the drill's record keeps its acks too
        with d.locked():
            record = d.load()
            record["acks"].append({"alert": args.alert, "at": now(), "comment": args.comment, "silence": silence_id})
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


def ack_token(token_file: Path | None, lab: lab_mod.Lab, pager: str) -> str | None:
    """The token an ack carries, as Alertmanager's webhooks do: --token-file's, else the lab's
    (STATE_DIR/pager.token) when the ack goes to the lab's own pager; None if there is none."""
    if token_file is not None:
        return read_token(token_file, "--token-file")
    if pager == lab.url("pager").rstrip("/") and lab.pager_token.exists():
        return read_token(lab.pager_token, "--token-file")
    return None


def _post_ack(pager: str, body: dict, token: str | None = None) -> dict:
    try:
        resp = requests.post(f"{pager}/api/ack", json=body, headers=bearer(token), timeout=5)
        answer = resp.json()
    except (requests.RequestException, ValueError) as err:
        raise UsageError(f"--pager: {pager} did not answer ({type(err).__name__})") from None
    if resp.status_code != 200 or not isinstance(answer, dict) or "incident" not in answer:
        said = answer.get("error") if isinstance(answer, dict) else resp.reason
        flag = "--token-file: " if resp.status_code == 401 else ""
        raise UsageError(f"{flag}the pager refused the ack: {said}")
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


def silence(
    alertmanager: str, alert: str, run_id: str, comment: str, minutes: float, auth: tuple[str, str] | None = None
) -> str:
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
        resp = requests.post(f"{alertmanager}/api/v2/silences", json=body, timeout=5, auth=auth)
        resp.raise_for_status()
        return str(resp.json()["silenceID"])
    except (requests.RequestException, ValueError, KeyError) as err:
        raise UsageError(f"--alertmanager: {alertmanager} did not answer ({type(err).__name__})") from None


def add_ack(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument("alert", help="the alert to acknowledge, e.g. TrainingLossJump")
    p.add_argument("--comment", default="", help="what you know so far (required: the incident records it)")
    p.add_argument("--by", default=None, help="who acknowledges (default: your user name)")
    p.add_argument("--expires", type=float, default=30, metavar="MINUTES", help="silence length (default 30)")
    p.add_argument("--run", default=None, help="the run whose incident to ack (default: the lab's, else the drill's)")
    p.add_argument("--alertmanager", default=None, metavar="URL",
                   help="Alertmanager to create the silence in (default: the lab's, from its state dir)")  # fmt: skip
    p.add_argument("--alertmanager-password-file", type=Path, default=None, metavar="PATH",
                   help="Alertmanager's password (default: the lab's, from its state dir; compose's console "
                        "gives its volume's)")  # fmt: skip
    p.add_argument("--pager", default=None, metavar="URL",
                   help="the pager that records the ack (default: the lab's, from its state dir)")  # fmt: skip
    p.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                   help="the pager's token, which the ack carries as webhooks do (default: the lab's "
                        "STATE_DIR/pager.token, when the ack goes to the lab's pager)")  # fmt: skip
    return ack

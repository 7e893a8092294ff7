"""`runwatch status`: the lab's run (its id, its last step as Prometheus holds it, or how it
ended) and each component's process and readiness. Exits 3 with no lab, 1 if a component is not
ready."""

from __future__ import annotations

import argparse

import requests

from runwatch.core.command import Command, add_state_dir, read_json
from runwatch.lab.supervise import Lab
from runwatch.prom.server import PromQLError, instant, quoted


def add_arguments(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    return status


def run_state(lab: Lab) -> str | None:
    """The lab's current run, as `status` tells it: its id, its last step as Prometheus holds it,
    and whether it is still running or when it ended (its run.json)."""
    meta = lab.state / "lab.json"
    if not meta.exists():
        return None
    record = read_json(meta, "the lab's record")
    if record.get("watch"):  # `up --watch`: the job is the user's, and names its own runs
        return f"watching {', '.join(map(str, record['watch']))}: your job's runs are in the console"
    run_id = str(record.get("run_id"))
    run_json = lab.runs / run_id / "run.json"
    run = read_json(run_json, "the run's record") if run_json.exists() else {}
    if run.get("status") in (None, "running"):
        try:
            found = instant(lab.url("prometheus"), f'runwatch_train_step{{run_id="{quoted(run_id)}"}}')
            state = f"running, at step {int(float(found[0]['value'][1]))}" if found else "running, not yet scraped"
        except (requests.RequestException, PromQLError):
            state = "running (Prometheus cannot say at which step)"
    else:
        state = f"{run['status']} at {str(run.get('ended_at'))[11:19]} UTC, last step {run.get('last_step')}"
    return f"run {run_id}: {state}"


def status(args: argparse.Namespace) -> int:
    lab = Lab(args.state_dir)
    records = lab.records()
    if not records:
        print(f"no lab in {lab.state}: start one with `runwatch up`")
        return 3
    print(run_state(lab) or f"no run recorded in {lab.state}")
    bad = 0
    for name, rec in records.items():
        if "damaged" in rec:
            print(f"  {name:13s} DAMAGED    {rec['damaged']}")
            bad += 1
            continue
        if not lab.alive(rec):
            state = "EXITED"
        else:
            try:
                ok = requests.get(str(rec.get("ready_url")), timeout=2, auth=lab.auth(name)).status_code == 200
            except requests.RequestException:
                ok = False
            state = "ready" if ok else "NOT READY"
        bad += state != "ready"
        print(f"  {name:13s} {state:10s} pid {rec['pid']:<8d} {rec.get('url', '')}")
    return 1 if bad else 0

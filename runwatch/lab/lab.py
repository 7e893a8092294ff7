"""The native lab: `runwatch up | down | status | reload`, without Docker.

`up` starts, on loopback and with the repository's own configuration files:

    trainer      http://127.0.0.1:8000/metrics   (runwatch train)
    pager        http://127.0.0.1:9095           (runwatch pager-serve)
    Alertmanager http://127.0.0.1:9093/api/v2/alerts (alertmanager or Debian's; with the lab's password)
    Prometheus   http://127.0.0.1:9090           (prometheus; `reload` sends it SIGHUP)
    console      http://127.0.0.1:9096/          (runwatch console: plate, pages, runbooks, ack)

What it starts, with which configuration, and how it is found again: supervise.py. Those are
the documented ports; `up --ports` moves any of them, and every command here finds the lab's
from its state directory (its lab.json).

`up` stays in the foreground until Ctrl-C unless --detach; `down` stops what `up` started, by
PID, after checking each PID still runs the command it was started with.
"""

from __future__ import annotations

import argparse
import functools
import signal
import time
from collections.abc import Callable
from pathlib import Path

import requests

from runwatch.core.addresses import DEFAULT_PORTS
from runwatch.core.command import Command, add_state_dir, number, read_json
from runwatch.core.paths import Layout
from runwatch.lab.argv import QUERY_TIMEOUT_S
from runwatch.lab.supervise import Lab
from runwatch.lab.up import add_ports, up
from runwatch.lab.watched import check_watch, watch_targets
from runwatch.prom.checks import evaluation_problems, run_all
from runwatch.prom.edits import check_edit
from runwatch.prom.server import PromQLError, instant, quoted
from runwatch.trainer.config import MAX_RANKS, SEED, STEP


def down(args: argparse.Namespace) -> int:
    lab = Lab(args.state_dir)
    if not lab.records():
        print(f"no lab running in {lab.state}")
        return 0
    with lab.locked(wait=True):
        print("stopped:", ", ".join(lab.stop_all()) or "nothing (all had exited)")
    return 0


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


def reload(args: argparse.Namespace) -> int:
    """Run every check `runwatch check` runs (its unit tests as `check --edit-of` the rules in
    force runs them: those that pin what the edit changed are left out), then ask Prometheus
    and Alertmanager to reload, then watch the new rules' first evaluations (promtool cannot see
    those): rules that fail when evaluated, that do not finish in their group's interval, or
    that make groups miss iterations are refused, and the rules in force before are put back."""
    lab = Lab(args.state_dir)
    meta = lab.state / "lab.json"
    lab.layout = Layout(Path(str(read_json(meta, "the lab's record").get("root")))) if meta.exists() else Layout()
    in_force = lab.prometheus_dir / "rules"  # an edit of these: checked as runwatch.prom.edits says
    unit_tests = functools.partial(check_edit, in_force=in_force) if in_force.is_dir() else None
    for check, ok, lines in run_all(lab.layout, unit_tests):
        if not ok:
            names = " ".join(str(f) for f in check.files)
            print(f"runwatch reload: refused, {check.name} failed; the running lab keeps its old config:\n  {names}")
            print("\n".join("      " + line for line in lines))
            return 1
    lab.render_alertmanager_config()
    lab.render_prometheus_config()  # an edit of prometheus.yml: the lab serves a rendered copy
    lab.install_rules()
    since = time.time()
    for name in ("prometheus", "alertmanager"):
        if not _reload(lab, name):
            if name == "prometheus":
                lab.restore_rules()
            return 1
        print(f"reloaded {name}")
    problems = evaluation_problems(lab.url("prometheus"), since, QUERY_TIMEOUT_S)
    if not problems:
        return 0
    print("runwatch reload: refused, the new rules do not evaluate as they should:")
    for line in problems:
        print(f"  {line}")
    lab.restore_rules()
    # The old groups end only once an evaluation in flight does: up to Prometheus's query timeout.
    if _reload(lab, "prometheus", timeout=RESTORE_TIMEOUT_S):
        print(f"runwatch reload: the rules in force before are back ({lab.prometheus_dir / 'rules'})")
    return 1


# The old groups end only once an evaluation in flight does, which Prometheus ends at its query
# timeout; and then the reload itself.
RESTORE_TIMEOUT_S = 2 * QUERY_TIMEOUT_S


def _reload(lab: Lab, name: str, timeout: float = 10) -> bool:
    """Tell a component to reload with SIGHUP, then wait for its own metrics to say the reload
    succeeded. Not over HTTP: the lab's servers take no reload from a web page (issue 40)."""
    proc = lab.process(lab.records().get(name, {}))
    if proc is None:
        print(
            f"runwatch reload: {name} is not running in {lab.state} (a compose lab: docker compose kill -s HUP {name})"
        )
        return False
    before = _last_reload(lab, name)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _last_reload(lab, name)
        if now is not None and before is not None and now[0] > before[0]:
            return True
        if now is not None and now[1] == 0 and (before is None or before[1] == 1):
            break  # it tried, and failed: the new config is not in force
        time.sleep(0.1)
    print(f"runwatch reload: {name} refused the reload: {lab.log_tail(name)}")
    return False


def _last_reload(lab: Lab, name: str) -> tuple[float, float] | None:
    """(when the last successful reload was, whether the last one succeeded), from the
    component's /metrics; None if it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = requests.get(f"{lab.url(name)}/metrics", timeout=2, auth=lab.auth(name))
        resp.raise_for_status()
        found = {s.name: s.value for f in text_string_to_metric_families(resp.text) for s in f.samples}
        return found[f"{name}_config_last_reload_success_timestamp_seconds"], found[
            f"{name}_config_last_reload_successful"
        ]
    except (requests.RequestException, ValueError, KeyError):
        return None


def add_up(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    p.add_argument(
        "--incident",
        default="none",
        help="incident for the trainer (INCIDENT:STRENGTH for a smaller one), or random for a drill",
    )
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--onset", type=STEP, default=None)
    p.add_argument("--fast-forward", type=STEP, default=0, metavar="STEP")
    control = DEFAULT_PORTS["control"]
    p.add_argument("--control", action="store_true", help=f"also run a healthy control trainer on :{control}")
    p.add_argument("--precision", choices=("fp64", "fp16"), default="fp64", help="fp16: mixed precision (Lesson 20)")
    p.add_argument(
        "--ranks", type=number(int, 1, MAX_RANKS), default=1,
        help=f"data-parallel ranks under MPI, rank r scraped on :{DEFAULT_PORTS['ranks']}+r (a cluster incident: 2+)",
    )  # fmt: skip
    add_ports(p)
    p.add_argument(
        "--watch", type=watch_targets, default=None, metavar="HOST:PORT[,...]|FILE",
        help="watch your own job (runwatch.watch) instead of starting the lab's trainer: its addresses, or a file "
        "of them, one a line",
    )  # fmt: skip
    p.add_argument("--detach", action="store_true", help="return once everything is ready")
    p.add_argument(
        "--no-wait-for-prometheus", action="store_true",
        help="the lab's clock runs on while Prometheus is away, as a real job's does (default: it waits, "
        "and holds the incident's onset until the alerts' baselines are recorded)",
    )  # fmt: skip
    p.add_argument("--drill-seed", type=SEED, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="configuration to run (default: the one `runwatch check` names)",
    )
    return up_or_watch


def up_or_watch(args: argparse.Namespace) -> int:
    if args.watch:
        check_watch(args)
    return up(args)


def add_simple(fn: Command) -> Callable[[argparse.ArgumentParser], Command]:
    def add(p: argparse.ArgumentParser) -> Command:
        add_state_dir(p)
        return fn

    return add


add_down, add_status, add_reload = add_simple(down), add_simple(status), add_simple(reload)

"""`runwatch reload`: the lab's edited YAML checked as `runwatch check --edit-of` the rules in
force checks it, then Prometheus and Alertmanager reloaded by SIGHUP, then the new rules' first
evaluations watched; what fails is refused and the rules in force before are put back."""

from __future__ import annotations

import argparse
import functools
import signal
import time
from pathlib import Path

import requests

from runwatch.core.command import Command, add_state_dir, read_json
from runwatch.core.paths import Layout
from runwatch.lab.argv import QUERY_TIMEOUT_S
from runwatch.lab.supervise import Lab
from runwatch.prom.checks import evaluation_problems, run_all
from runwatch.prom.edits import check_edit


def add_arguments(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    return reload


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

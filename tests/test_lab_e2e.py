"""The live lab end to end, with the real binaries: `runwatch up`, pages, faults, `down`.

The lab is the session's (tests/conftest.py).

One lab (Prometheus, Alertmanager, pager, an incident trainer and its healthy control) serves
every scenario; each fault scenario adds its own trainer, with its own run id, as a second
target of the trainer job, so the scenarios share one Prometheus. The lab runs on the default
ports, so these tests run one after another.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from runwatch.backtest.backtest import duration_seconds
from runwatch.lab.supervise import Component, Lab
from runwatch.oncall.pager import RUNBOOK_BASE, WATCHDOG_TIMEOUT_S, read_pages, received_time
from runwatch.prom.server import instant, wait_ready
from tests.conftest import GRAFANA_PORT, LINK, edit, project_links, runwatch, threshold, wait_for

PROM = "http://127.0.0.1:9090"
TRAINING_ALERTS = {"TrainingLossJump", "GradientNormJump", "HeldOutGap", "ThroughputDrop"}


def pages(lab: Lab, run_id: str | None = None, alert: str | None = None, status: str = "firing") -> list[dict]:
    return [
        p
        for p in read_pages(lab.page_log)
        if (run_id is None or p["run_id"] == run_id)
        and (alert is None or p["alert"] == alert)
        and p["status"] == status
    ]


class ExtraTrainer:
    """A trainer of its own for one scenario, added to the trainer job through file_sd."""

    def __init__(self, lab: Lab, name: str, port: int, *args: str):
        self.lab, self.name, self.port = lab, name, port
        self.run_id = f"e2e-{name}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runwatch", "train", "--port", str(port), "--run-id", self.run_id,
             "--run-dir", str(lab.runs / self.run_id), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 20, self.proc)
        lab.write_target(f"trainer-{name}", [f"127.0.0.1:{port}"])
        wait_for(lambda: instant(PROM, f'up{{instance="127.0.0.1:{port}"}} == 1'), 30, f"{name} to be scraped")

    def step(self) -> int:
        found = instant(PROM, f'runwatch_train_step{{run_id="{self.run_id}"}}')
        return int(float(found[0]["value"][1])) if found else -1

    def close(self) -> None:
        self.lab.remove_target(f"trainer-{self.name}")
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def firing_in_prometheus(alert: str, run_id: str) -> bool:
    return bool(instant(PROM, f'ALERTS{{alertname="{alert}",run_id="{run_id}",alertstate="firing"}}'))


def test_status_reports_every_component_ready(lab):
    step = f'runwatch_train_step{{run_id="{lab.run_id}"}}'
    wait_for(lambda: instant(PROM, step), 30, "the first scrape of the run")  # before it, status says so
    res = runwatch("status", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert res.returncode == 0, res.stdout
    for name in ("trainer", "control", "pager", "alertmanager", "prometheus", "console"):
        assert f"{name}" in res.stdout
    assert res.stdout.count(" ready ") == 6
    assert res.stdout.startswith(f"run {lab.run_id}: running, at step ")  # which run, and how far


def test_every_link_the_project_writes_or_prints_opens_on_the_native_lab(lab):
    """README, the lab guide, the runbooks, the rules' annotations, the dashboards' links,
    `runwatch status` and the page lines: each address answers 200 here (Debian's Prometheus 3
    and Alertmanager serve no web UI, so nothing links into one)."""
    wait_for(lambda: pages(lab, lab.run_id), 90, "the incident's first page")
    links = project_links()
    printed = runwatch("status", "--state-dir", str(lab.state), cwd=lab.cwd).stdout
    printed += runwatch("pager", "--log", str(lab.page_log), "--all", "--prometheus", "", cwd=lab.cwd).stdout
    for m in LINK.finditer(printed):
        links.setdefault(m.group(0).rstrip(".:;"), set()).add("printed by runwatch")
    assert len(links) > 20 and any("printed by runwatch" in w for w in links.values())
    broken = {}
    for url, where in sorted(links.items()):
        if int(LINK.match(url)[1]) == GRAFANA_PORT:
            continue
        try:
            status = requests.get(url, timeout=10).status_code  # redirects followed, as a browser does
        except requests.RequestException as err:
            status = type(err).__name__
        if status != 200:
            broken[url] = (status, sorted(where))
    assert broken == {}


def test_corrupt_shard_pages_loss_and_gradient_norm_at_the_onset(lab):
    for alert in ("TrainingLossJump", "GradientNormJump"):
        page = wait_for(lambda a=alert: pages(lab, lab.run_id, a), 60, f"a {alert} page")[0]
        assert 300 <= int(page["step"]) <= 302, page  # the plate: 300; live lag may add a step
        assert page["summary"] and page["runbook_url"] == f"{RUNBOOK_BASE}/{alert}.md"
    assert all(int(p["step"]) >= 300 for p in pages(lab, lab.run_id) if p["step"])  # nothing before the onset
    assert not pages(lab, lab.run_id, "ThroughputDrop") and not pages(lab, lab.run_id, "HeldOutGap")
    control = [p for p in read_pages(lab.page_log) if "control" in p["run_id"]]
    assert control == []  # the healthy run alongside produced no page


def test_killed_trainer_pages_trainer_down_within_15s(lab):
    extra = ExtraTrainer(lab, "killed", 8102)
    extra.proc.kill()
    extra.proc.wait()
    killed_at = time.monotonic()
    page = wait_for(
        lambda: [p for p in pages(lab, alert="TrainerDown") if p["labels"].get("instance") == "127.0.0.1:8102"],
        30,
        "a TrainerDown page",
    )[0]
    assert time.monotonic() - killed_at <= 15
    assert "127.0.0.1:8102" in page["summary"]
    extra.close()


def restart(lab: Lab, name: str) -> None:
    record = lab.records()[name]
    lab.stop(name)
    lab.start(Component(name, record["argv"], record["ready_url"], record["url"]))


def test_a_cluster_run_joins_the_lab_each_rank_a_target_of_its_own(lab):
    """Four ranks over MPI join the running lab as `runwatch up --ranks 4` adds them: the job's
    metrics on the trainer job, each rank on the ranks job (targets/ranks*.json), labelled with
    its rank and node, its GPU with DCGM's labels."""
    run_id, base = "e2e-ranks", 8110
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "train", "--ranks", "4", "--incident", "straggler", "--onset", "5",
         "--port", "8106", "--rank-port-base", str(base), "--run-id", run_id, "--run-dir", str(lab.runs / run_id)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert all(wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc) for port in (8106, *range(base, base + 4)))
        lab.write_target("trainer-ranks", ["127.0.0.1:8106"])
        lab.write_target("ranks-e2e", [f"127.0.0.1:{base + r}" for r in range(4)])
        query = f'runwatch_rank_step{{job="ranks",run_id="{run_id}"}}'
        ranks = wait_for(lambda: len(found := instant(PROM, query)) == 4 and found, 30, "every rank scraped")
        assert sorted((s["metric"]["rank"], s["metric"]["node"]) for s in ranks) == [
            ("0", "node0"),
            ("1", "node0"),
            ("2", "node1"),
            ("3", "node1"),
        ]
        gpus = instant(PROM, 'DCGM_FI_DEV_SM_CLOCK{job="ranks"}')
        assert {(s["metric"]["Hostname"], s["metric"]["gpu"]) for s in gpus} >= {("node0", "0"), ("node1", "1")}
        job = f'runwatch_train_step{{job="trainer",run_id="{run_id}"}}'  # rank 0 serves the job's metrics
        wait_for(lambda: instant(PROM, job), 30, "the job's metrics on the trainer job")
    finally:
        lab.remove_target("ranks-e2e")
        lab.remove_target("trainer-ranks")
        proc.terminate()
        proc.wait(30)


def test_alertmanager_restart_during_an_incident_still_pages_once(lab):
    extra = ExtraTrainer(lab, "amrestart", 8103, "--incident", "corrupt_shard", "--fast-forward", "275")
    try:
        wait_for(lambda: extra.step() >= 297, 30, "the trainer to near its onset")
        record = lab.records()["alertmanager"]
        lab.stop("alertmanager")
        wait_for(lambda: firing_in_prometheus("TrainingLossJump", extra.run_id), 30, "the alert to fire in Prometheus")
        time.sleep(2)  # Prometheus tries to send while Alertmanager is away
        lab.start(Component("alertmanager", record["argv"], record["ready_url"], record["url"]))
        wait_for(lambda: pages(lab, extra.run_id, "TrainingLossJump"), 30, "the page after the restart")
        time.sleep(6)  # a group_interval: time for a duplicate to show up, if there were one
        assert len(pages(lab, extra.run_id, "TrainingLossJump")) == 1
    finally:
        extra.close()


def test_pager_down_then_back_gets_the_page_once(lab):
    extra = ExtraTrainer(lab, "pagerdown", 8104, "--incident", "corrupt_shard", "--fast-forward", "275")
    try:
        record = lab.records()["pager"]
        lab.stop("pager")
        wait_for(lambda: firing_in_prometheus("GradientNormJump", extra.run_id), 40, "the alert to fire in Prometheus")
        time.sleep(3)  # Alertmanager's first delivery fails
        assert not pages(lab, extra.run_id)
        lab.start(Component("pager", record["argv"], record["ready_url"], record["url"]))
        wait_for(lambda: pages(lab, extra.run_id, "GradientNormJump"), 40, "Alertmanager's retry to deliver")
        time.sleep(6)
        assert len(pages(lab, extra.run_id, "GradientNormJump")) == 1
    finally:
        extra.close()


def test_broken_rule_edit_is_refused_by_reload_and_old_rules_keep_firing(lab):
    alerts = lab.layout.rules_dir / "alerts.yml"
    good = alerts.read_text()
    alerts.write_text(good.replace("> scalar(", ">> scalar(", 1))
    try:
        res = runwatch("reload", "--state-dir", str(lab.state), cwd=lab.cwd)
        assert res.returncode == 1
        assert "refused" in res.stdout and "alerts.yml" in res.stdout and "parse error" in res.stdout
        extra = ExtraTrainer(lab, "reload", 8105, "--incident", "corrupt_shard", "--fast-forward", "275")
        try:
            wait_for(lambda: pages(lab, extra.run_id, "GradientNormJump"), 40, "a page from the old rules")
        finally:
            extra.close()
    finally:
        alerts.write_text(good)
    res = runwatch("reload", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert res.returncode == 0 and "reloaded prometheus" in res.stdout


def test_reload_runs_what_check_runs_and_names_rules_that_fail_when_evaluated(lab):
    """A threshold edit that breaks a promtool unit test is refused, as `check` refuses it; a rule
    promtool accepts but Prometheus cannot evaluate (every target's CPU matched on nothing) is
    applied and named."""
    rules = lab.layout.rules_dir
    good = {name: (rules / name).read_text() for name in ("alerts.yml", "baselines.yml")}
    try:
        edit(rules / "alerts.yml", threshold("GradientNormJump", "3"), threshold("GradientNormJump", "3.5"))
        res = runwatch("reload", "--state-dir", str(lab.state), cwd=lab.cwd)
        assert res.returncode == 1 and "refused, promtool test rules failed" in res.stdout, res.stdout
        assert "GradientNormJump" in res.stdout and str(rules.parent / "tests") in res.stdout
        (rules / "alerts.yml").write_text(good["alerts.yml"])
        (rules / "baselines.yml").write_text(
            good["baselines.yml"] + "\n      - record: job:cpu:product\n"
            "        expr: process_cpu_seconds_total * on() process_cpu_seconds_total\n"  # no unit test has it
        )
        res = runwatch("reload", "--state-dir", str(lab.state), cwd=lab.cwd)
        assert res.returncode == 1 and "reloaded prometheus" in res.stdout, res.stdout
        assert "fails when evaluated: job:cpu:product (group runwatch-baselines)" in res.stdout
        assert "many-to-many" in res.stdout
    finally:
        for name, text in good.items():
            (rules / name).write_text(text)
    res = runwatch("reload", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert res.returncode == 0 and "fails when evaluated" not in res.stdout, res.stdout


def test_up_refuses_a_second_lab_and_busy_ports(lab, tmp_path):
    res = runwatch("up", "--state-dir", str(lab.state), "--detach", cwd=tmp_path)
    assert res.returncode == 2 and "already running" in res.stderr
    res = runwatch("up", "--state-dir", str(tmp_path / "other"), "--detach", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "port 8000 is already in use" in res.stderr


def test_status_reports_a_dead_component(lab):
    record = lab.records()["control"]
    lab.stop("control")
    (lab.pids / "control.json").write_text(json.dumps(record) + "\n")  # as if it had died on its own
    res = runwatch("status", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert res.returncode == 1 and "EXITED" in res.stdout


def test_pager_metrics_count_the_pages(lab):
    """The pager's counters equal the lines its process added to the page log, by status (earlier
    scenarios restart the pager, and counters start again with the process), read when no page
    arrived in between."""
    started = lab.records()["pager"]["create_time"]

    def counts() -> tuple[dict, dict] | None:
        log = read_pages(lab.page_log)
        before = [p for p in log if received_time(p) >= started]
        families = text_string_to_metric_families(requests.get("http://127.0.0.1:9095/metrics", timeout=5).text)
        counted = {
            s.labels["status"]: s.value for f in families for s in f.samples if s.name == "runwatch_pager_pages_total"
        }
        logged = {status: float(sum(p["status"] == status for p in before)) for status in ("firing", "resolved")}
        return (counted, logged) if read_pages(lab.page_log) == log else None

    counted, logged = wait_for(counts, 10, "a quiet moment in the page log")
    assert logged["firing"] > 0 and counted == logged


def test_prometheus_told_to_quit_pages_watchdog_silent(lab, lab_session):
    """Any local process can POST /-/quit (the lab runs with --web.enable-lifecycle for reload).
    Nothing can alert on Prometheus from Prometheus: the pager's dead-man's switch does. Bound:
    the pager's watchdog timeout, plus the Watchdog route's repeat interval (the last heartbeat
    may be that old), plus a few seconds for Alertmanager to let the alert lapse. Last in this
    file: the lab is stopped afterwards."""
    route = next(
        r for r in yaml.safe_load(lab.alertmanager_yml.read_text())["route"]["routes"] if r["receiver"] == "watchdog"
    )
    bound = WATCHDOG_TIMEOUT_S + duration_seconds(route["repeat_interval"]) + 10

    def heard() -> bool:  # the switch is armed by the first heartbeat
        text = requests.get("http://127.0.0.1:9095/metrics", timeout=5).text
        return any(
            s.value > 0 for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "runwatch_pager_watchdog_last_timestamp_seconds"
        )  # fmt: skip

    try:
        wait_for(heard, bound, "the first Watchdog heartbeat")
        assert requests.post(f"{PROM}/-/quit", timeout=5).status_code == 200
        page = wait_for(lambda: pages(lab, "", "WatchdogSilent"), bound, "the pager's WatchdogSilent page")[0]
        assert page["severity"] == "critical" and page["runbook_url"] == f"{RUNBOOK_BASE}/WatchdogSilent.md"
    finally:
        lab_session.stop()

"""No incident lost to a gap in scraping: the native lab, its real Prometheus stopped (SIGSTOP)
before an onset or its Alertmanager restarted right after `up`, and the pages that arrive.

The readouts are the plate's (runwatch.backtest.signatures), shifted to the run's real onset:
run.json says where the trainer took it, when a gap had emptied the baselines' windows.
Compose's counterparts are in test_compose_e2e.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests
import yaml

from runwatch.backtest.signatures import PLATE_READOUTS, SIGNATURES
from runwatch.core.durations import duration_seconds
from runwatch.core.names import FIRST_FIRED, SCRAPE_INTERVAL_S, WATCH_GRACE_S
from runwatch.lab.argv import Component
from runwatch.lab.supervise import Lab
from runwatch.prom.server import instant, query_range
from runwatch.trainer.config import TrainConfig
from tests.conftest import DISCOVERY_S, holds, wait_for
from tests.test_lab_e2e import ExtraTrainer, group_interval_s, pages

pytestmark = pytest.mark.e2e

PAUSE_S = 30  # the 30-40 s: long enough to empty every baseline's window but the longest
NEAR_ONSET = 275  # fast-forward: 25 scraped steps before the plate's onset


def refill_s(lab: Lab) -> float:
    """How long after scrapes return every baseline holds enough samples again, at the most: the
    longest window plus offset of baselines.yml (a window full of fresh samples satisfies any
    of its count guards), from the lab's own rule file."""
    text = (lab.layout.rules_dir / "baselines.yml").read_text()
    windows = [duration_seconds(w) + duration_seconds(o or "0s") for w, o in
               re.findall(r"\[(\d+[smh])\](?:\s+offset\s+(\d+[smh]))?", text)]  # fmt: skip
    return max(windows)


def page_bound_s(lab: Lab, alert: str, incident: str) -> float:
    """From the onset to the page, at the most: the signature's last step, the alert's `for:`,
    Alertmanager's group_wait, and an evaluation and a scrape."""
    rules = yaml.safe_load((lab.layout.rules_dir / "alerts.yml").read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
    route = yaml.safe_load(lab.alertmanager_yml.read_text())["route"]
    lo, hi = SIGNATURES[incident][alert].fires
    return (
        hi - TrainConfig.onset + 1 + duration_seconds(rule.get("for", "0s")) + duration_seconds(route["group_wait"]) + 2
    )


def first_alert(incident: str) -> str:
    """The alert the plate has page first for this incident."""
    return min(PLATE_READOUTS[incident], key=PLATE_READOUTS[incident].__getitem__)


def run_record(lab: Lab) -> dict:
    return json.loads((lab.runs / lab.run_id / "run.json").read_text())


def step(lab: Lab) -> int:
    found = instant(lab.url("prometheus"), f'runwatch_train_step{{run_id="{lab.run_id}"}}')
    return int(float(found[0]["value"][1])) if found else -1


def readouts(lab: Lab) -> dict[str, int]:
    """The step each alert first fired at in the lab's run: the first-fire record every readout reads."""
    found = instant(lab.url("prometheus"), f'{FIRST_FIRED}{{run_id="{lab.run_id}"}}')
    return {s["metric"]["alertname"]: int(float(s["value"][1])) for s in found}


def assert_the_plate_s_readouts(lab: Lab, incident: str, onset: int) -> None:
    """Each alert the plate has fire does so in its window shifted to the real onset (live lag
    may add a step, as in test_lab_e2e's readouts: the rule evaluation that first sees a step's
    sample can come after the next scrape); each the plate keeps silent has not fired (so far)."""
    shift, got = onset - TrainConfig.onset, readouts(lab)
    for alert, expect in SIGNATURES[incident].items():
        if expect.fires is not None:
            lo, hi = expect.fires
            assert lo + shift <= got.get(alert, -1) <= hi + shift + 1, (alert, got, onset)
        elif expect.after is None:
            assert alert not in got, (alert, got, onset)


def paused_before_the_onset(lab_factory, incident: str) -> None:
    lab = lab_factory("--incident", incident, "--fast-forward", str(NEAR_ONSET)).wait()
    prom = lab.records()["prometheus"]["pid"]
    wait_for(lambda: step(lab) >= 283, 30, "the trainer to near its onset")  # 17 steps before it
    os.kill(prom, signal.SIGSTOP)
    try:
        # The trainer holds once the last scrape is older than the grace: its run.json says so.
        wait_for(lambda: run_record(lab).get("paused_since"), WATCH_GRACE_S + 5, "the trainer to pause")
        paused_at = run_record(lab)["last_step"]
        time.sleep(PAUSE_S)
        assert run_record(lab)["last_step"] == paused_at  # no step while nobody watched
    finally:
        os.kill(prom, signal.SIGCONT)
    wait_for(lambda: run_record(lab).get("onset_moved_by"), refill_s(lab) + 10, "the onset, moved")
    record = run_record(lab)
    onset = record["config"]["onset"]
    # Taken once the baselines are recorded again: at the earliest, the plate's onset.
    assert onset == TrainConfig.onset + record["onset_moved_by"] and onset > TrainConfig.onset
    alert = first_alert(incident)
    page = wait_for(lambda: pages(lab, lab.run_id, alert), page_bound_s(lab, alert, incident) + refill_s(lab),
                    f"a {alert} page")[0]  # fmt: skip
    lo, hi = (s + onset - TrainConfig.onset for s in SIGNATURES[incident][alert].fires)
    assert lo <= int(page["step"]) <= hi + 1, (page["step"], onset)  # live lag may add a step, as test_lab_e2e's
    # every window of the plate's signature passed (a repeated batch's loss alert comes 60 steps on)
    last = max(e.fires[1] for e in SIGNATURES[incident].values() if e.fires) + onset - TrainConfig.onset
    wait_for(lambda: step(lab) >= last + 2, last + 2 - step(lab) + 10, f"step {last + 2}")
    assert_the_plate_s_readouts(lab, incident, onset)
    waited = instant(lab.url("prometheus"), f'runwatch_train_watcher_wait_seconds_total{{run_id="{lab.run_id}"}}')
    assert float(waited[0]["value"][1]) >= PAUSE_S - WATCH_GRACE_S  # counted, and exported
    log = (lab.logs / "trainer.log").read_text()
    assert f"paused after step {paused_at}: Prometheus has not scraped for" in log and "resumed after step" in log
    holds(lambda: len(pages(lab, lab.run_id, alert)) == 1, group_interval_s(lab), "a second page")


@pytest.mark.slow  # 90 s of lab time: make test keeps within its 5 minutes (a lost target stays)
def test_prometheus_stopped_before_an_lr_spike_s_onset_still_pages_at_its_readout(lab_factory):
    paused_before_the_onset(lab_factory, "lr_spike")


@pytest.mark.slow
@pytest.mark.parametrize("incident", ["corrupt_shard", "repeated_batch"])
def test_prometheus_stopped_before_the_onset_moves_no_readout(lab_factory, incident):
    paused_before_the_onset(lab_factory, incident)


@pytest.mark.slow  # a lab of its own for 47 s (compose's tier restarts its Alertmanager five times)
def test_alertmanager_restarted_right_after_up_pages_the_incident_once_at_its_readout(lab_factory):
    lab = lab_factory("--incident", "lr_spike", "--fast-forward", str(NEAR_ONSET)).wait()
    am = lab.records()["alertmanager"]
    lab.stop("alertmanager")
    lab.start(Component.from_record("alertmanager", am))
    alert = first_alert("lr_spike")
    bound = TrainConfig.onset - NEAR_ONSET + refill_s(lab) + page_bound_s(lab, alert, "lr_spike")
    page = wait_for(lambda: pages(lab, lab.run_id, alert), bound, f"a {alert} page")[0]
    onset = run_record(lab)["config"]["onset"]
    lo, hi = (s + onset - TrainConfig.onset for s in SIGNATURES["lr_spike"][alert].fires)
    assert lo <= int(page["step"]) <= hi + 1, (page["step"], onset)
    assert_the_plate_s_readouts(lab, "lr_spike", onset)
    holds(lambda: len(pages(lab, lab.run_id, alert)) == 1, group_interval_s(lab), "a second page")


def test_a_trainer_prometheus_cannot_reach_pauses_and_the_console_says_so(lab):
    """Its target gone from file_sd (as a network that drops it), Prometheus runs on without
    scraping the trainer: the trainer holds, the console reads "paused" from Prometheus's own
    view, and when the target returns the run goes on with its wait counted."""
    extra = ExtraTrainer(lab, "unseen", "--wait-for-prometheus", "--prometheus", lab.url("prometheus"))
    record = lab.runs / extra.run_id / "run.json"
    console = f"{lab.url('console')}/api/plate"
    try:
        lab.remove_target(f"trainer-{extra.name}")
        # Prometheus drops it first: its discovery hands targets on within DISCOVERY_S, and the
        # stopped scrape loop marks the series stale within two scrape intervals. Before that,
        # a scrape late on a loaded host can pause the trainer for a moment, and it resumes.
        up = f'up{{instance="127.0.0.1:{extra.port}"}}'
        wait_for(lambda: not instant(lab.url("prometheus"), up), DISCOVERY_S + 3 * SCRAPE_INTERVAL_S, "the drop")
        wait_for(lambda: json.loads(record.read_text()).get("paused_since"), WATCH_GRACE_S + 10, "the pause")
        held_at = json.loads(record.read_text())["last_step"]
        answers: list[dict] = []

        def paused() -> dict | None:
            answers.append(requests.get(console, params={"run": extra.run_id}, timeout=5).json())
            return answers[-1] if answers[-1].get("paused_for") else None

        # the trainer holds only once Prometheus has not scraped it for WATCH_GRACE_S, so the
        # console's next answer says paused; the time is the answer's on a loaded host
        def said() -> str:
            last = answers[-1] if answers else {}
            keys = ("paused_for", "unseen", "stopped", "error")
            return f"the console to say paused (it last said {dict((k, last.get(k)) for k in keys)})"

        plate = wait_for(paused, 10, said)
        assert plate["paused_for"] > WATCH_GRACE_S and plate["ended"] is None
        assert json.loads(record.read_text())["last_step"] == held_at
        lab.write_target(f"trainer-{extra.name}", [f"127.0.0.1:{extra.port}"])
        wait_for(lambda: extra.step() > held_at, 30, "the run to go on")
        waited = f'runwatch_train_watcher_wait_seconds_total{{run_id="{extra.run_id}"}} > 0'
        wait_for(lambda: instant(lab.url("prometheus"), waited), 10, "the wait, counted")
        assert json.loads(record.read_text())["paused_since"] is None
    finally:
        extra.close()


@pytest.mark.slow
def test_a_busy_host_is_not_a_slow_node(lab, tmp_path):
    """A healthy run beside two CPU hogs, its own process stopped for 2 s at a time as a host
    that stalls: the host's wall time per step shows the stalls, ThroughputDrop (which reads
    tokens/s, the simulated device's) never goes pending. Measured on the wall clock, one
    stalled step was a 50% drop, past the threshold with no `for:`."""
    extra = ExtraTrainer(lab, "busy", "--wait-for-prometheus", "--prometheus", lab.url("prometheus"))
    prom = lab.url("prometheus")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        # the throughput baseline fills (25 scraped steps, baselines.yml), then the host stalls
        baseline = f'run:runwatch_train_tokens_per_second:avg60s_offset5s{{run_id="{extra.run_id}"}}'
        wait_for(lambda: instant(prom, baseline), refill_s(lab), "the throughput baseline")
        began = time.time()
        for _ in range(4):
            extra.proc.send_signal(signal.SIGSTOP)
            time.sleep(2.0)
            extra.proc.send_signal(signal.SIGCONT)
            time.sleep(6.0)
        ended = time.time()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    stalled = f'runwatch_train_step_duration_seconds_bucket{{run_id="{extra.run_id}",le="1.5"}}'
    total = f'runwatch_train_step_duration_seconds_count{{run_id="{extra.run_id}"}}'
    within, steps = (float(instant(prom, q)[0]["value"][1]) for q in (stalled, total))
    assert steps - within >= 3, (within, steps)  # the host's stalls, visible in its wall time per step
    alerts = f'ALERTS{{alertname="ThroughputDrop",run_id="{extra.run_id}"}}'
    assert query_range(prom, alerts, began, ended + 5, 1.0) == []  # neither pending nor firing
    extra.close()

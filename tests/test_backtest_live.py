"""The backtest against the live lab: the same seeds and incidents give the same first-fire steps.

A real native lab (`runwatch up`: Prometheus, Alertmanager, the pager, an incident trainer and its
healthy control over HTTP) runs each incident; its first-fire record
(`run_alert:runwatch_train_step:first_fired`) is compared with `runwatch backtest` of the same
seeds, evaluated in the order the lab's Prometheus evaluates its rule groups after each
trainer's scrape (Schedule.of_lab). Minutes per incident: slow.

The lab's ports are the default ones (the lab has no others yet): the test frees the session's
lab first and runs on the `fixed-ports` worker. Its state directory and configuration are its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest
import requests
import yaml

from runwatch.backtest import backtest as bt
from runwatch.backtest.plan import RACE_S, Schedule
from runwatch.core.durations import duration_seconds
from runwatch.core.names import FIRST_FIRED
from runwatch.core.paths import REPO
from runwatch.lab.supervise import Lab
from runwatch.prom.server import instant
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.live import PHASE_SCRAPES, SCRAPE_PHASE
from runwatch.trainer.run import Trainer
from tests.conftest import runwatch, wait_for

pytestmark = pytest.mark.slow

GROUPS_READ = ("runwatch-baselines", "runwatch-training")  # the groups whose order the plate's alerts depend on
ATTEMPTS = 4  # labs started before one whose groups do not race the scrapes (each one in two has none)


def config() -> dict:
    return yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())["global"]


def longest_reach(rules_dir: Path) -> float:
    """How far back of an evaluation the plate's rules (GROUPS_READ) read, in seconds: the longest
    range plus offset, plus the longest `for:`."""
    reach, hold = 0.0, 0.0
    for f in rules_dir.glob("*.yml"):
        for group in yaml.safe_load(f.read_text())["groups"]:
            for rule in group["rules"] if group["name"] in GROUPS_READ else ():
                if rule.get("record") == FIRST_FIRED:  # bookkeeping: it reads back 10 minutes, decides nothing
                    continue
                ranges = [duration_seconds(r) for r in re.findall(r"\[(\w+)(?::\w*)?\]", rule["expr"])]
                offsets = [duration_seconds(o) for o in re.findall(r"offset\s+(\w+)", rule["expr"])]
                reach = max(reach, max(ranges, default=0) + max(offsets, default=0))
                hold = max(hold, duration_seconds(str(rule.get("for", "0s"))))
    return reach + hold


def live_first_fires(prom: str) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for s in instant(prom, "run_alert:runwatch_train_step:first_fired"):
        found.setdefault(s["metric"]["run_id"], {})[s["metric"]["alertname"]] = int(float(s["value"][1]))
    return found


def rule_groups(prom: str) -> list[dict]:
    return requests.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]


def step_of(prom: str, run_id: str) -> int:
    found = instant(prom, f'runwatch_train_step{{run_id="{run_id}"}}')
    return int(float(found[0]["value"][1])) if found else -1


def ends(cfg: TrainConfig) -> list[float]:
    """When each step ends on the lab clock."""
    return [r.lab_time for r in Trainer(cfg).run()]


def from_scrape(t: float) -> float:
    """Lab seconds from the scrape nearest lab time t (SCRAPE_PHASE into a lab second)."""
    return (t - SCRAPE_PHASE + 0.5) % 1.0 - 0.5


def off_the_lab_clock(prom: str, run_dir: Path, cfg: TrainConfig, last: int) -> list[str]:
    """The backtest's assumption, checked on the lab: its scrapes fall SCRAPE_PHASE into a lab
    second (their median; a scrape of a busy Prometheus can start some ms late), and each one up
    to step `last` shows the last step that ended by it on the lab clock (a step that ends
    within RACE_S of the scrape may be read by either). What is not so, one line each."""
    record = json.loads((run_dir / "run.json").read_text())
    zero = record["live_since"] - record["live_lab_time"]  # wall time of lab time 0
    end = ends(cfg)
    values = instant(prom, f'runwatch_train_step{{run_id="{cfg.run_id}"}}[15m]')[0]["values"]
    scrapes = [(float(t) - zero, int(v)) for t, v in values if int(v) <= last]
    phase = statistics.median(from_scrape(t) for t, _ in scrapes)
    wrong = [] if abs(phase) < RACE_S else [f"{cfg.run_id}: its scrapes fall {phase:+.3f} s off SCRAPE_PHASE"]
    for t, v in scrapes:
        near = min(abs(t - end[v]), abs(end[v + 1] - t)) < RACE_S  # a step ends within RACE_S of it
        if not near and not end[v] <= t < end[v + 1]:
            wrong.append(f"{cfg.run_id}: the scrape at lab time {t:.3f} shows step {v}")
    return wrong


def trainer_down_for(rules_dir: Path) -> float:
    """TrainerDown's `for:`: the time it allows a starting Prometheus to find and scrape a trainer."""
    rules = [r for g in yaml.safe_load((rules_dir / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    return duration_seconds(next(r["for"] for r in rules if r.get("alert") == "TrainerDown"))


def fires(cfg: TrainConfig, rules: Path, schedule: Schedule | None, horizon: int = 10**9) -> dict[str, int]:
    """The backtest's first fires of one run, up to step `horizon`."""
    res = bt.backtest([cfg.seed], rules, (cfg.incident,), workers=1, progress=lambda *a, **k: None, schedule=schedule)
    return {a: s for a, s in res.runs[0]["first_fire"].items() if s is not None and s <= horizon}


def compare(root: Path, state: Path, cfg: TrainConfig, fast_forward: int, horizon: int) -> dict | None:
    """Start a lab of cfg's incident and seed with its control in `state`, and compare each run's
    first-fire record with the backtest's; None if a rule group races a trainer's scrapes."""
    rules, glob = root / "prometheus" / "rules", config()
    scrape, evaluation = (duration_seconds(glob[k]) for k in ("scrape_interval", "evaluation_interval"))
    # A first fire at step s is recorded by the evaluation that reads the scrape showing s; it has
    # happened once the scrapes show s + margin: one scrape late at most (Schedule), one
    # evaluation interval, and one scrape interval for the record's evaluation to read it.
    margin = 1 + math.ceil((scrape + evaluation) / cfg.step_seconds)
    up = runwatch("up", "--root", str(root), "--state-dir", str(state), "--incident", cfg.incident,
                  "--seed", str(cfg.seed), "--fast-forward", str(fast_forward), "--control", "--ports", "free",
                  "--detach", cwd=root)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        run_id = json.loads((state / "lab.json").read_text())["run_id"]
        lab = Lab(state)  # on free ports: where it listens is in its lab.json
        prom = lab.url("prometheus")
        control_id = next(p.name for p in (state / "runs").iterdir() if p.name != run_id)
        both = (run_id, control_id)
        wait_for(
            lambda: min(map(lambda r: step_of(prom, r), both)) >= 0,
            trainer_down_for(rules) + 2 * scrape,
            "both runs scraped",
        )
        intervals = [float(g["interval"]) for g in rule_groups(prom)]
        wait_for(
            lambda: not any(g["lastEvaluation"].startswith("0001-") for g in rule_groups(prom)),
            max(intervals) + 2 * scrape,
            "every rule group's first evaluation (the slowest's comes within its interval)",
        )
        schedules = {
            run_id: Schedule.of_lab(prom, lab.ports["trainer"]),
            control_id: Schedule.of_lab(prom, lab.ports["control"]),
        }
        if any(set(GROUPS_READ) & s.racing for s in schedules.values()):
            return None  # a group evaluating while a trainer's scrape is in flight reads it or not, at random

        # the lab clock from the first live step to the horizon, plus the scrapes the trainer times
        # first, the phase it waits for after them (under a second), and a scrape's timeout
        end = ends(cfg)
        bound = end[horizon + margin] - (end[fast_forward - 1] if fast_forward else 0.0) + PHASE_SCRAPES * scrape + 1
        bound += duration_seconds(glob["scrape_timeout"])
        wait_for(lambda: step_of(prom, run_id) >= horizon + margin, bound, f"{run_id} to pass step {horizon + margin}")
        live = live_first_fires(prom)
        recorded = {rid: {a: s for a, s in live.get(rid, {}).items() if s <= horizon} for rid in both}
        # The backtests once the lab has recorded every fire compared: their two busy cores would
        # delay the live trainer's steps by tens of ms.
        configs = {run_id: cfg, control_id: TrainConfig(incident="none", seed=cfg.seed)}
        expected = {rid: fires(c, rules, schedules[rid], horizon) for rid, c in configs.items()}
        runs = {rid: (state / "runs" / rid, dataclasses.replace(c, run_id=rid)) for rid, c in configs.items()}
        clock = [w for run_dir, c in runs.values() for w in off_the_lab_clock(prom, run_dir, c, horizon)]
        return {"recorded": recorded, "expected": expected, "schedules": schedules, "run_id": run_id, "clock": clock}
    finally:
        down = runwatch("down", "--state-dir", str(state), cwd=root)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.parametrize("incident, seed", [("repeated_batch", 7), ("lr_spike", 8)])
def test_the_backtest_reads_the_first_fires_the_live_lab_records(incident, seed, tmp_path, lab_state):
    root = tmp_path / "checkout"
    for d in ("prometheus", "alertmanager", "runbooks"):
        shutil.copytree(REPO / d, root / d)
    cfg, rules = TrainConfig(incident=incident, seed=seed), root / "prometheus" / "rules"
    # Live from the first step whose every window at the onset holds only live steps, as in the
    # backtest's runs (a fast-forward leaves Prometheus no history before it). A window longer
    # than the steps before the onset (ThroughputDrop's 6-hour baseline) holds every step from
    # 0 in both: the live run then trains from step 0, as the backtest's does.
    fast_forward = max(0, cfg.onset - math.ceil(longest_reach(rules)) - 1)
    # Compared up to two steps after every fire the backtest expects read fresh (a lab's order of
    # groups moves a fire by a scrape, two where the jitter then skips a step), or the onset's window.
    fresh = [fires(c, rules, None) for c in (cfg, TrainConfig(incident="none", seed=seed))]
    horizon = max([cfg.onset + 10, *(s + 2 for f in fresh for s in f.values())])
    # The seed's steps around each fire end farther than RACE_S from the scrapes that read them:
    # a live scrape reads such a step as the backtest does, whatever the milliseconds.
    end = ends(cfg)
    close = [
        s for f in fresh for fire in f.values() for s in range(fire - 1, fire + 3) if abs(from_scrape(end[s])) < RACE_S
    ]
    assert not close, f"seed {seed}: steps {close} end within {RACE_S} s of a scrape: choose another seed"
    for attempt in range(ATTEMPTS):  # the groups' phases follow from their files' paths: a new state dir
        found = compare(root, tmp_path / f"state-{attempt}", cfg, fast_forward, horizon)
        if found is not None:
            break
    else:
        pytest.fail(f"in {ATTEMPTS} labs a rule group evaluated while a trainer's scrape was in flight")
    assert found["recorded"] == found["expected"], found
    assert not found["clock"], found["clock"]
    assert found["expected"][found["run_id"]], "the incident fired nothing: the comparison would prove little"

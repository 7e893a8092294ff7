"""`runwatch backtest` through a real Prometheus: the plate's signatures, its output, its failures."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runwatch.backtest import backtest as bt
from runwatch.backtest import data, evaluate
from runwatch.backtest.plan import Schedule, parse_seeds
from runwatch.backtest.report import report
from runwatch.core.bounded import MAX_RULE_FILE_BYTES
from runwatch.core.command import UsageError
from runwatch.core.durations import duration_seconds
from runwatch.core.paths import REPO
from runwatch.prom.server import instant, query_range
from tests.conftest import edit, need, threshold, wait_for


def backtest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", "backtest", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def its_prometheus(pid: int) -> list[psutil.Process]:
    """The Prometheus processes among a backtest's own descendants (never a machine-wide search)."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "prometheus"]
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
def three_seeds(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bt")
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "backtest", "--seeds", "0-2", "--json", str(tmp / "bt.json")],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started: dict[int, psutil.Process] = {}  # every Prometheus the backtest started, seen while it runs
    while proc.poll() is None:
        started |= {p.pid: p for p in its_prometheus(proc.pid)}
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    doc = json.loads((tmp / "bt.json").read_text())
    return {"stdout": stdout, "stderr": stderr, "doc": doc, "prometheus": list(started.values())}


def first_fires(doc: dict, incident: str, alert: str) -> list:
    return [r["first_fire"][alert] for r in doc["runs"] if r["incident"] == incident]


@pytest.mark.integration
def test_the_plates_signatures(three_seeds):
    doc = three_seeds["doc"]
    inc = doc["summary"]["incidents"]
    assert {k: v["signature_matched"] for k, v in inc.items()} == {i: 3 for i in inc}
    assert all(s in (300, 301) for s in first_fires(doc, "corrupt_shard", "TrainingLossJump"))
    assert all(s in (300, 301) for s in first_fires(doc, "corrupt_shard", "GradientNormJump"))
    assert all(300 <= s <= 302 for s in first_fires(doc, "lr_spike", "TrainingLossJump"))
    assert all(300 <= s <= 339 for s in first_fires(doc, "repeated_batch", "HeldOutGap"))
    assert all(360 <= s <= 365 for s in first_fires(doc, "repeated_batch", "TrainingLossJump"))
    assert all(300 <= s <= 302 for s in first_fires(doc, "slow_node", "ThroughputDrop"))
    for alert in ("TrainingLossJump", "GradientNormJump", "HeldOutGap", "ThroughputDrop", "TrainerDown"):
        assert first_fires(doc, "none", alert) == [None, None, None]
    assert doc["summary"]["false_alarms"] == []


@pytest.mark.integration
def test_json_shape(three_seeds):
    runs = three_seeds["doc"]["runs"]
    assert len(runs) == 15
    for r in runs:
        assert set(r) == {"incident", "seed", "run_id", "strength", "seconds", "first_fire", "began"}
        assert all(v is None or type(v) is int for v in r["first_fire"].values())


@pytest.mark.integration
def test_report_and_progress(three_seeds):
    assert "corrupt_shard   300" in three_seeds["stdout"]
    assert "[300]" in three_seeds["stdout"]  # the plate's readout beside ours
    assert "15 fp64 runs (3 seeds x 5 incidents)" in three_seeds["stdout"]
    assert "trained and loaded" in three_seeds["stderr"] and "reading HeldOutGap" in three_seeds["stderr"]
    assert three_seeds["prometheus"]  # it ran a Prometheus of its own ...
    assert [p for p in three_seeds["prometheus"] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.integration
def test_an_edited_rule_changes_what_it_catches(tmp_path):
    """The learning loop: a looser HeldOutGap catches the repeated batch sooner."""
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    alerts = rules / "alerts.yml"
    edit(alerts, threshold("HeldOutGap", "2"), threshold("HeldOutGap", "1.5"))
    edit(alerts, "for: 10s", "for: 3s")
    res = backtest(
        "--seeds", "0-2", "--incidents", "repeated_batch", "--rules", str(rules), "--json", "e.json", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    edited = first_fires(json.loads((tmp_path / "e.json").read_text()), "repeated_batch", "HeldOutGap")
    res = backtest("--seeds", "0-2", "--incidents", "repeated_batch", "--json", "d.json", cwd=tmp_path)
    default = first_fires(json.loads((tmp_path / "d.json").read_text()), "repeated_batch", "HeldOutGap")
    assert all(e < d for e, d in zip(edited, default, strict=True)), (edited, default)


@pytest.mark.integration
def test_a_noisy_rule_and_a_deaf_one_are_reported(tmp_path):
    """The report's false alarms, off-step firings and misses can be non-zero: a gradient rule
    that fires on noise pages the healthy run and fires early in the incident; a loss rule with
    a threshold of 300x never fires."""
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", threshold("GradientNormJump", "3"), threshold("GradientNormJump", "0.5"))
    edit(rules / "alerts.yml", threshold("TrainingLossJump", "3"), threshold("TrainingLossJump", "300"))
    res = backtest(
        "--seeds", "0", "--incidents", "none,corrupt_shard", "--rules", str(rules), "--json", "r.json", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    found = {
        kind: {(f["incident"], f["alert"]) for f in summary[kind]} for kind in ("false_alarms", "off_steps", "missed")
    }
    assert ("none", "GradientNormJump") in found["false_alarms"]
    assert ("corrupt_shard", "GradientNormJump") in found["off_steps"]
    assert ("corrupt_shard", "TrainingLossJump") in found["missed"]
    assert "false alarms (fired where the plate says silent): 0" not in res.stdout
    assert "  none seed 0: GradientNormJump at step" in res.stdout
    assert "  corrupt_shard seed 0: TrainingLossJump never (fires at 300)" in res.stdout


@pytest.mark.integration
def test_rules_that_fail_promtool_are_refused_with_its_message(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", "> scalar(", ">> scalar(", 1)
    res = backtest("--seeds", "0", "--rules", str(rules), cwd=tmp_path)
    assert res.returncode == 2
    first = res.stderr.splitlines()[0]
    assert first.startswith("runwatch backtest: --rules: promtool check rules refused")
    assert "alerts.yml" in res.stderr and "parse error" in res.stderr
    assert list(tmp_path.iterdir()) == [rules]


# An alert that flickers: x counts up one an evaluation, and x % 20 < 10 holds for 10
# evaluations, then not for 10. Prometheus keeps a firing alert firing until K evaluations
# after the condition last held: with K = 10 it bridges each gap of 10; with K = 9 it resolves
# at the gap's last evaluation (19, 39) and fires, and pages, again at the next.
FLICKER_FIRING = {10: set(range(40)), 9: set(range(40)) - {19, 39}}


@pytest.mark.integration
@pytest.mark.parametrize("keep", sorted(FLICKER_FIRING))
def test_keep_firing_for_is_read_as_prometheus_keeps_the_alert_firing(tmp_path, keep):
    """Issue 39: nothing read keep_firing_for, so a rule using it (ThroughputDrop's 30 s) began to
    fire, and paged, more often in the backtest than in the lab. Both sides of its boundary,
    in promtool: the alert's own state and the backtest's firing query, evaluated by Prometheus."""
    from runwatch.backtest.plan import firing_query

    rule = {"alert": "Flicker", "expr": "x % 20 < 10", "keep_firing_for": f"{keep}s"}
    query = firing_query(rule["expr"], rule)
    assert query == f"count_over_time((x % 20 < 10)[{keep * 1000 + 500}ms:1s])"
    (tmp_path / "r.yml").write_text(json.dumps({"groups": [{"name": "g", "interval": "1s", "rules": [rule]}]}))
    firing = FLICKER_FIRING[keep]
    test = {"rule_files": ["r.yml"], "evaluation_interval": "1s", "tests": [{
        "interval": "1s", "input_series": [{"series": "x", "values": "0+1x60"}],
        "alert_rule_test": [{"eval_time": f"{t}s", "alertname": "Flicker",
                             "exp_alerts": [{"exp_labels": {}}] if t in firing else []} for t in range(40)],
        "promql_expr_test": [{"expr": f"count({query})", "eval_time": f"{t}s",
                              "exp_samples": [{"labels": "{}", "value": 1}] if t in firing else []} for t in range(40)],
    }]}  # fmt: skip
    (tmp_path / "t.yml").write_text(json.dumps(test))
    res = subprocess.run([need("promtool"), "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_alert_with_both_for_and_keep_firing_for_is_named_as_one_that_cannot_be_backtested():
    """Prometheus keeps such an alert firing through a short gap without waiting its for: again:
    a state no query over stored data replays, so the backtest says so instead of guessing."""
    from runwatch.backtest.rules import holds

    assert holds({"alert": "A", "expr": "x", "for": "10s"}) == (10, 0)
    assert holds({"alert": "A", "expr": "x", "for": "10s", "keep_firing_for": "0s"}) == (10, 0)
    with pytest.raises(UsageError, match=r"^--rules: alert A cannot be backtested: it has both for: and keep_firing"):
        holds({"alert": "A", "expr": "x", "for": "10s", "keep_firing_for": "30s"})


@pytest.mark.integration
def test_a_rule_file_with_an_alert_that_cannot_be_backtested_is_refused_before_any_run(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", "        keep_firing_for: 30s\n", "        for: 5s\n        keep_firing_for: 30s\n", 1)
    res = backtest("--seeds", "0", "--rules", str(rules), cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "runwatch backtest: --rules: alert ThroughputDrop cannot be backtested: it has both for: and keep_firing_for:, "
        "whose state no query over stored data replays; backtest it with one of them"
    ]
    assert list(tmp_path.iterdir()) == [rules]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, flag",
    [(["--seeds", "9-1"], "--seeds"), (["--seeds", "a"], "--seeds"), (["--incidents", "meteor"], "--incidents"),
     (["--rules", "nowhere"], "--rules"), (["--json", "no/such/dir/x.json"], "--json")],
)  # fmt: skip
def test_bad_flags(tmp_path, args, flag):
    res = backtest(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr


@pytest.mark.integration
def test_ctrl_c_stops_prometheus(tmp_path):
    """Ctrl-C while the backtest's Prometheus evaluates: a learner's rule that is slow to evaluate
    (the median of a 10 ms subquery over 10 minutes: over a minute here) keeps it busy."""
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    (rules / "slow.yml").write_text(
        "groups:\n  - name: slow\n    rules:\n      - alert: Slow\n"
        "        expr: quantile_over_time(0.5, runwatch_train_loss[10m:10ms]) < 0\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "backtest", "--seeds", "0-5", "--rules", str(rules), "--no-cache"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # As in a terminal: a suite launched in the background (`make test &`) inherits an
        # ignored SIGINT, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline and "reading Slow" not in seen:
        seen += proc.stderr.readline()
    assert "reading Slow" in seen
    children = wait_for(lambda: its_prometheus(proc.pid), 30, "the backtest's own Prometheus")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    # is_running() checks the start time too, so a reused PID is not mistaken for a leftover
    assert [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


def test_parsers():
    assert parse_seeds("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    with pytest.raises(UsageError, match="--seeds"):
        parse_seeds("1-")
    assert duration_seconds("1m30s") == 90 and duration_seconds("10s") == 10 and duration_seconds("0s") == 0


@pytest.mark.integration
def test_mixed_precision_backtest_reports_the_new_alerts_lead(tmp_path):
    """Lesson 20 measured: for a learning-rate spike, how many steps before the loss alert do
    the loss scale and the activation norm warn? (Here: none; they follow or tie.)"""
    res = backtest("--seeds", "0-3", "--incidents", "none,lr_spike", "--precision", "fp16", "--json", "f.json",
                   cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "f.json").read_text())["summary"]
    lead = summary["lead_over_loss_alert"]["lr_spike"]
    assert lead["ActivationNormSpike"]["fired"] == 4 and -1 <= lead["ActivationNormSpike"]["median_lead"] <= 1
    assert -4 <= lead["LossScaleCollapse"]["median_lead"] <= 0
    assert summary["false_alarms"] == []
    assert "steps before TrainingLossJump" in res.stdout
    # The readout table: every cell is set off by two spaces, however wide (an fp16 cell such as
    # "301.5 (300-355) 18/100 [-]" used to run into its neighbour).
    header, *rows = [ln for ln in res.stdout.splitlines() if ln.startswith(("incident ", "none ", "lr_spike "))]
    columns = len(re.split(r"\s{2,}", header.strip()))
    assert columns == 2 + len(summary["incidents"]["none"]["alerts"]), header
    for row in rows:
        assert len(re.split(r"\s{2,}", row.strip())) == columns, row


def test_the_readout_table_keeps_two_spaces_between_wide_cells():
    cell = {"fired": 18, "runs": 100, "median": 301.5, "min": 300, "max": 355, "plate": None}
    summary = {
        "incidents": {"lr_spike": {"runs": 100, "signature_matched": 100, "alerts": {"A": cell, "B": cell}}},
        "false_alarms": [], "off_steps": [], "missed": [], "unattributed_firings": {},
    }  # fmt: skip
    row = next(ln for ln in report(summary, ["A", "B"]).splitlines() if ln.startswith("lr_spike"))
    assert row == "lr_spike        301.5 (300-355) 18/100 [-]  301.5 (300-355) 18/100 [-]  100/100"


# --- the edit-and-see loop: the data cache, and recording rules inlined or backfilled ---


def cached_backtest(cache: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runwatch", "backtest", "--seeds", "0-1", "--incidents", "none,repeated_batch", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, "RUNWATCH_CACHE": str(cache)},
    )  # fmt: skip


def readouts(path: Path) -> list:
    return json.loads(path.read_text())["runs"]


@pytest.mark.slow  # three backtests and a rebuilt cache, 40 s: make test keeps within its 5 minutes
@pytest.mark.integration
def test_a_rule_edit_reads_the_cached_runs_and_a_damaged_cache_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first = cached_backtest(cache, "--json", "a.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "trained and loaded" in first.stderr and "(from the cache)" not in first.stdout
    [entry] = [e for e in cache.iterdir() if not e.name.startswith(".")]

    again = cached_backtest(cache, "--json", "b.json", cwd=tmp_path)
    assert "loaded 4 runs from the cache" in again.stderr and "trained" not in again.stderr
    assert "(from the cache)" in again.stdout
    assert readouts(tmp_path / "b.json") == readouts(tmp_path / "a.json")
    assert re.findall(r"reading (\w+) \(", again.stderr) == []  # every alert's result kept from the first run

    # the learner's edit: the same runs, read from the cache, under the new rule
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", threshold("HeldOutGap", "2"), threshold("HeldOutGap", "1.5"))
    edited = cached_backtest(cache, "--rules", str(rules), "--json", "e.json", cwd=tmp_path)
    assert "from the cache" in edited.stderr
    assert re.findall(r"reading (\w+) \(", edited.stderr) == ["HeldOutGap"]  # only the edited alert is evaluated
    sooner = [r["first_fire"]["HeldOutGap"] for r in readouts(tmp_path / "e.json") if r["incident"] != "none"]
    before = [r["first_fire"]["HeldOutGap"] for r in readouts(tmp_path / "a.json") if r["incident"] != "none"]
    assert all(s < b for s, b in zip(sooner, before, strict=True)), (sooner, before)

    # a damaged result is found by its checksum: that alert is evaluated again, the same
    for kept in (entry / "results").iterdir():
        kept.write_text(kept.read_text().replace('"at": ', '"at": 1'))
    recomputed = cached_backtest(cache, "--json", "r.json", cwd=tmp_path)
    assert "loaded 4 runs from the cache" in recomputed.stderr and "reading HeldOutGap (" in recomputed.stderr
    assert readouts(tmp_path / "r.json") == readouts(tmp_path / "a.json")

    # a damaged block is found by its checksum: the entry is rebuilt, never read
    chunk = next(p for p in (entry / "blocks").rglob("chunks/*"))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    rebuilt = cached_backtest(cache, "--json", "c.json", cwd=tmp_path)
    assert "trained and loaded" in rebuilt.stderr and "from the cache" not in rebuilt.stderr
    assert readouts(tmp_path / "c.json") == readouts(tmp_path / "a.json")
    # ... and so is an entry whose manifest is not one
    (entry / "manifest.json").write_text("{not json")
    assert "trained and loaded" in cached_backtest(cache, cwd=tmp_path).stderr
    assert "from the cache" in cached_backtest(cache, cwd=tmp_path).stderr


@pytest.mark.integration
def test_no_cache_leaves_the_cache_alone(tmp_path):
    res = cached_backtest(tmp_path / "cache", "--no-cache", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "trained and loaded" in res.stderr and not (tmp_path / "cache").exists()


@pytest.mark.integration
def test_a_recording_read_with_matchers_is_backfilled_and_reads_the_same(tmp_path):
    """A form the inliner does not rewrite (label matchers on a recorded series) falls back to
    promtool's backfill of that rule; both ways give the same readouts."""
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    edit(rules / "alerts.yml", "run:runwatch_train_heldout_to_train_loss:ratio20s\n",
         'run:runwatch_train_heldout_to_train_loss:ratio20s{job="trainer"}\n', 1)  # fmt: skip
    matched = cached_backtest(tmp_path / "cache", "--rules", str(rules), "--json", "m.json", cwd=tmp_path)
    assert matched.returncode == 0, matched.stderr
    assert "backfilling 1 rules (pass 1/1)" in matched.stderr
    plain = cached_backtest(tmp_path / "cache", "--json", "p.json", cwd=tmp_path)
    assert "backfilling" not in plain.stderr
    assert readouts(tmp_path / "m.json") == readouts(tmp_path / "p.json")
    assert {r["first_fire"]["HeldOutGap"] is not None for r in readouts(tmp_path / "m.json")} == {True, False}


@pytest.mark.integration
def test_every_recording_inlined_or_every_one_backfilled_gives_the_same_readouts():
    """The shipped rules both ways, on a sample of seeds: inlined as subqueries (the default)
    and backfilled pass by pass with promtool, as the backtest used to."""
    seeds, rules = [3, 4], REPO / "prometheus" / "rules"
    inlined = bt.backtest(seeds, rules, progress=lambda *a, **k: None)
    backfilled = bt.backtest(seeds, rules, progress=lambda *a, **k: None, inline=False)
    assert inlined.runs == backfilled.runs and inlined.unattributed == backfilled.unattributed == {}
    assert sum(v is not None for r in inlined.runs for v in r["first_fire"].values()) >= 10


@pytest.mark.integration
def test_a_backfilled_recording_lands_on_the_whole_seconds_subqueries_evaluate_on(tmp_path):
    """What the fallback backfills is at whole seconds, where an inlined subquery evaluates, on any
    Prometheus: no group's hashed phase is involved (promtool's `create-blocks-from rules` has one)."""
    prometheus = need("prometheus")
    families = {"runwatch_train_step", "up"}
    meta, _ = data.train_and_load([5], ("none",), tmp_path, families, prometheus, 1, "fp64", lambda *a, **k: None)
    prom = data.throwaway(prometheus, tmp_path, meta)
    rule = {"record": "backtest:step:count", "expr": "count(runwatch_train_step)", "labels": {"why": "test"}}
    evaluate.backfill(prom, [[rule]], lambda *a, **k: None)
    with prom.running():
        found = instant(prom.base, "timestamp(backtest:step:count)", prom.start + 100.5)
        stamps = query_range(prom.base, "timestamp(backtest:step:count)", prom.start, prom.end, 7.0)
        value = instant(prom.base, 'backtest:step:count{why="test"}', prom.start + 100.5)
    assert float(found[0]["value"][1]) == prom.start + 100
    assert {float(v) % 1 for s in stamps for _, v in s["values"]} == {0.0}
    assert float(value[0]["value"][1]) == 1


def test_the_grid_is_the_live_lab_s_scrapes_on_the_lab_clock():
    """A whole second of the grid falls SCRAPE_PHASE into a lab second of every run, as the live
    trainer sets its clock against Prometheus's scrapes (trainer.live), not at a hashed phase."""
    from runwatch.trainer.config import TrainConfig
    from runwatch.trainer.live import SCRAPE_PHASE
    from runwatch.trainer.offline import OfflineRun, simulate

    run = simulate(TrainConfig(seed=1))
    shifted = OfflineRun(run.cfg, run.records, shift_ms=data.GRID_PHASE_MS)
    lab = [r.lab_time for r in run.records]
    for stamp, t in zip(shifted.stamps_ms(), lab, strict=True):
        assert (stamp / 1000 - run.start) % 1 == pytest.approx((t - SCRAPE_PHASE) % 1, abs=1e-3)


@pytest.mark.parametrize(
    "after_scrape, training_reads_baselines",
    [({"runwatch-baselines": 0.2, "runwatch-training": 0.7}, 0),  # baselines first after the scrape: fresh
     ({"runwatch-baselines": 0.7, "runwatch-training": 0.2}, 1)],  # the alerts first: a scrape late
)  # fmt: skip
def test_a_group_reads_another_s_recording_late_when_that_one_evaluates_after_it(
    after_scrape, training_reads_baselines
):
    schedule = Schedule(after_scrape)
    assert schedule.lag(("runwatch-training", 0), ("runwatch-baselines", 4)) == training_reads_baselines
    assert schedule.lag(("runwatch-cluster", 3), ("runwatch-cluster", 0)) == 0  # earlier in its own group
    assert schedule.lag(("runwatch-cluster", 0), ("runwatch-cluster", 3)) == 1  # later: the last evaluation's
    with pytest.raises(UsageError, match="no rule group 'runwatch-gone'"):
        schedule.lag(("runwatch-gone", 0), ("runwatch-baselines", 0))


@pytest.mark.integration
def test_a_lab_s_order_moves_only_the_alerts_that_read_recordings_alone():
    """In a lab whose alerts evaluate after the scrape and before the baselines, an alert whose
    condition is recordings only (TrainingLossJump) reads them a scrape late: one step later."""
    seeds, rules = [3], REPO / "prometheus" / "rules"
    late = Schedule({"runwatch-baselines": 0.9, "runwatch-training": 0.3, "runwatch-targets": 0.5,
                        "runwatch-cluster-ranks": 0.1, "runwatch-cluster-gpus": 0.1,
                        "runwatch-cluster": 0.1, "runwatch-cluster-10m": 0.2})  # fmt: skip
    fresh = bt.backtest(seeds, rules, ("corrupt_shard",), progress=lambda *a, **k: None)
    lagged = bt.backtest(seeds, rules, ("corrupt_shard",), progress=lambda *a, **k: None, schedule=late)
    assert fresh.runs[0]["first_fire"]["TrainingLossJump"] == 300
    assert lagged.runs[0]["first_fire"]["TrainingLossJump"] == 301
    assert lagged.runs[0]["first_fire"]["GradientNormJump"] == fresh.runs[0]["first_fire"]["GradientNormJump"] == 300


@pytest.mark.slow  # four MPI ranks and a Prometheus of their own, 18 s of both cores
@pytest.mark.integration
def test_a_backtest_over_four_ranks_names_the_straggler(tmp_path):
    """The cluster's readouts: over 4 ranks a straggler pages StragglerRank naming its rank and
    GPUThermalThrottle its GPU within 21 steps (30 lab seconds) of the onset; a slow node and a
    healthy run page no cluster alert; the plate's incidents keep their signature. The faults
    are read in seconds from the fault: a hang's TrainingStalled within T + 5 = 15 s, a crash's
    RankDown and JobRestarted within 15 s."""
    res = backtest("--seeds", "0-1", "--ranks", "4", "--incidents", "none,slow_node,straggler,hang,rank_crash,ecc",
                   "--json", "c.json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    incidents = doc["summary"]["incidents"]
    assert {i: v["signature_matched"] for i, v in incidents.items()} == dict.fromkeys(
        ("none", "slow_node", "straggler", "hang", "rank_crash", "ecc"), 2
    )
    after = {(r["incident"], a): s for r in doc["runs"] for a, s in r.get("after_fault", {}).items()}
    assert 10 <= after[("hang", "TrainingStalled")] <= 15 and after[("hang", "GPUXidError")] is None
    assert after[("rank_crash", "RankDown")] <= 15 and after[("rank_crash", "JobRestarted")] <= 15
    assert "seconds from the fault to the first fire" in res.stdout
    assert incidents["straggler"]["named_right_rank"] == {"StragglerRank": 2}
    assert all(300 <= s <= 321 for s in first_fires(doc, "straggler", "StragglerRank"))
    for incident in ("none", "slow_node"):
        assert (
            first_fires(doc, incident, "StragglerRank")
            == first_fires(doc, incident, "GPUThermalThrottle")
            == [None, None]
        )
    assert doc["summary"]["false_alarms"] == [] and doc["summary"]["unattributed_firings"] == {}
    assert "over 4 ranks" in res.stdout and "named the struck rank, and only it, in 2/2 runs" in res.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, flag",
    [(["--incidents", "straggler"], "--incidents"), (["--ranks", "3"], "--ranks"), (["--ranks", "2", "--precision",
     "fp16"], "--precision")],
)  # fmt: skip
def test_bad_cluster_flags(tmp_path, args, flag):
    res = backtest("--seeds", "0", *args, cwd=tmp_path)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr, res.stderr


# --- issue 28, item 10: hostile rule files, and Ctrl-C at any moment ---


@pytest.mark.integration
def test_a_rule_file_that_is_a_device_or_too_big_is_refused_before_promtool_reads_it(tmp_path):
    """`--rules` with a.yml -> /dev/zero took promtool to 8.5 GB in 5 s."""
    for name, make in (("device", lambda p: p.symlink_to("/dev/zero")),
                       ("huge", lambda p: p.write_bytes(b"#" * ((MAX_RULE_FILE_BYTES) + 1)))):  # fmt: skip
        rules = tmp_path / name
        shutil.copytree(REPO / "prometheus" / "rules", rules)
        make(rules / "a.yml")
        res = backtest("--seeds", "0", "--rules", str(rules), "--no-cache", cwd=tmp_path)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith("runwatch backtest: --rules: ") and "a.yml" in res.stderr


def _interrupt_group(proc: subprocess.Popen) -> None:
    """Ctrl-C as a terminal sends it: to the whole foreground process group, workers included."""
    os.killpg(proc.pid, signal.SIGINT)


def _backtest_in_a_group(tmp_path: Path, *args: str) -> subprocess.Popen:
    def own_group() -> None:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # see test_ctrl_c_stops_prometheus

    return subprocess.Popen(
        [sys.executable, "-m", "runwatch", "backtest", "--seeds", "0-3", "--no-cache", *args], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=own_group,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip


@pytest.mark.integration
def test_ctrl_c_while_the_loader_starts_stops_it_and_every_worker(tmp_path):
    """Ctrl-C while the loading Prometheus started left it running with its folder gone (2 of 10
    tries), and once hung over 60 s in the process pool. Now every child stops, with one line."""
    proc = _backtest_in_a_group(tmp_path)
    children = wait_for(lambda: its_prometheus(proc.pid), 60, "the loading Prometheus")
    everyone = psutil.Process(proc.pid).children(recursive=True)  # the workers too, if they have started
    _interrupt_group(proc)
    _, err = proc.communicate(timeout=30)  # the bound of Process.stop's grace, and the pool's joins
    assert proc.returncode == 130 and err.strip().splitlines() == ["runwatch backtest: interrupted"], err
    for child in children + everyone:
        assert not (child.is_running() and child.status() != psutil.STATUS_ZOMBIE), child
    assert not list(tmp_path.glob("runwatch-backtest-*"))


@pytest.mark.integration
def test_ctrl_c_while_the_command_imports_is_one_line(tmp_path):
    """Before 0.45 s, while the backtest's modules import (numpy's), a Ctrl-C printed a traceback."""
    proc = _backtest_in_a_group(tmp_path)

    def importing_numpy() -> bool:
        try:
            return any("numpy" in m.path for m in psutil.Process(proc.pid).memory_maps())
        except psutil.Error:
            return False

    wait_for(importing_numpy, 30, "the backtest importing numpy")
    _interrupt_group(proc)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines() in (["runwatch: interrupted"], ["runwatch backtest: interrupted"]), err

"""The cluster's faults offline: where each strikes, the job's attempts and restart, and what the
scrapes of the OpenMetrics file see through the stall, the teardown and the restart; and the
drills that hide them."""

import io
import json
import math
import random
import time
from collections import Counter
from typing import NamedTuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runwatch.trainer.config import INCIDENTS, LLAMA3_SHARES, TrainConfig, draw_drill
from runwatch.trainer.faults import (
    XID_EXIT_SECONDS,
    attempts,
    checkpoint_before,
    drain_step,
    fault_of,
    lost_steps,
    schedule,
)
from runwatch.trainer.offline import simulate, write_openmetrics
from runwatch.trainer.run import Trainer, compute_seconds
from runwatch.trainer.sealed import seal
from tests.conftest import runwatch


def cfg_of(incident: str, seed: int = 101) -> TrainConfig:
    """A short run (the writer's cost grows with it): the fault strikes in steps 61-109."""
    return TrainConfig(ranks=4, incident=incident, seed=seed, onset=60, steps=160)


@pytest.mark.parametrize("incident", ["hang", "rank_crash", "ecc"])
def test_a_fault_strikes_one_rank_within_a_checkpoint_interval_of_the_onset(incident):
    struck = set()
    for seed in range(40):
        f = fault_of(cfg_of(incident, seed))
        assert f.kind == incident and 0 <= f.rank < 4 and 61 <= f.step <= 109
        assert f.xid == {"hang": 0, "rank_crash": 79}.get(incident, f.xid) and f.xid in (0, 79, 48, 63)
        struck.add((f.rank, f.step))
    assert len(struck) > 10  # the seed chooses: no fixed rank or step to learn
    assert {fault_of(cfg_of("ecc", s)).xid for s in range(40)} == {48, 63}
    assert fault_of(cfg_of("straggler")) is None and fault_of(TrainConfig()) is None


def test_checkpoints_fall_after_every_50th_step():
    cfg = TrainConfig()
    assert [checkpoint_before(cfg, s) for s in (0, 48, 49, 50, 344)] == [-1, -1, 49, 49, 299]
    ecc = cfg_of("ecc")
    assert drain_step(ecc, fault_of(ecc)) == checkpoint_before(ecc, fault_of(ecc).step) + 50


def job_of(cfg: TrainConfig):
    records = Trainer(cfg).run()
    lab = [r.lab_time for r in records]
    return records, lab, attempts(cfg, lab, compute_seconds(cfg)), schedule(cfg, lab, compute_seconds(cfg))


def test_a_hang_stalls_until_the_watchdog_then_the_job_restarts_from_its_checkpoint():
    cfg = cfg_of("hang")
    f = fault_of(cfg)
    _, lab, (first, second), samples = job_of(cfg)
    entered = min(compute_seconds(cfg)[r, f.step] for r in range(4) if r != f.rank)
    assert (first.end, first.stopped) == (f.step, lab[f.step - 1] + entered + cfg.watchdog_seconds)
    resume = checkpoint_before(cfg, f.step - 1) + 1
    assert (second.first, second.began) == (resume, first.stopped + cfg.restart_seconds)
    assert lost_steps([first, second]) == f.step - resume
    stall = [s for s in samples if s.state == "stall"]
    down = [s for s in samples if s.state == "down"]
    # a scrape a second through the stall and the restart's wait, showing the last step finished
    assert len(stall) == math.ceil(first.stopped - lab[f.step - 1]) - 1
    assert {s.step for s in stall + down} == {f.step - 1} and len(down) == cfg.restart_seconds
    assert [s.step for s in samples if s.state == "step"] == [*range(f.step), *range(resume, cfg.steps)]
    assert all(a.t < b.t for a, b in zip(samples, samples[1:], strict=False))


def test_a_crash_ends_the_job_as_its_rank_exits_and_an_ecc_error_at_the_next_checkpoint():
    crash = cfg_of("rank_crash")
    _, lab, (first, _), _ = job_of(crash)
    assert first.stopped == lab[fault_of(crash).step - 1] + XID_EXIT_SECONDS
    ecc = cfg_of("ecc")
    _, lab, (first, second), samples = job_of(ecc)
    drain = drain_step(ecc, fault_of(ecc))
    assert (first.end, second.first, first.stopped) == (drain + 1, drain + 1, lab[drain])  # nothing lost
    assert not [s for s in samples if s.state == "stall"]


def test_without_a_fault_there_is_one_sample_per_step_as_ever():
    cfg = cfg_of("straggler")
    records, lab, runs, samples = job_of(cfg)
    assert len(runs) == 1 and [(s.t, s.step, s.state) for s in samples] == [(t, i, "step") for i, t in enumerate(lab)]
    assert simulate(cfg).samples is None


class Sample(NamedTuple):
    labels: dict
    value: float
    timestamp: float  # seconds, as written


def scraped(cfg: TrainConfig) -> dict[str, list[Sample]]:
    """Every sample of the run's OpenMetrics file, by name. (The text parser reads a timestamp as
    milliseconds, as the Prometheus text format has it.)"""
    text = io.StringIO()
    write_openmetrics([simulate(cfg)], text)
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text.getvalue().replace("# EOF\n", "")):
        for s in family.samples:
            out.setdefault(s.name, []).append(Sample(s.labels, s.value, round(s.timestamp * 1000, 3)))
    return out


def test_the_file_holds_what_the_scrapes_saw_through_a_crash_and_its_restart():
    cfg = cfg_of("rank_crash")
    f = fault_of(cfg)
    run = simulate(cfg)
    samples = scraped(cfg)
    down_at = {float(t) for s, t in zip(run.samples, run.stamps(), strict=True) if s.state == "down"}
    ups = [s for s in samples["up"] if s.labels["job"] == "ranks"]
    assert {(s.labels["rank"], s.labels["node"], s.labels["run_id"]) for s in ups} == {
        (str(r), f"node{r // 2}", cfg.label) for r in range(4)
    }
    assert {s.timestamp for s in ups if s.value == 0} == down_at  # every target down while the job is
    assert not [s for s in samples["runwatch_rank_step"] if s.timestamp in down_at]
    xids = [s for s in samples["DCGM_FI_DEV_XID_ERRORS"] if s.value]
    assert {s.value for s in xids} == {79} and {s.labels["instance"] for s in xids} == {
        f"offline/{cfg.label}/rank{f.rank}"
    }
    assert len(xids) == XID_EXIT_SECONDS - 1  # the scrapes between the XID and the rank's exit
    restarts = [s for s in samples["runwatch_job_restarts_total"]]
    first_one = min(s.timestamp for s in restarts if s.value == 1)
    assert first_one == min(down_at) and {s.value for s in restarts} == {0, 1}
    lost = max(s.value for s in samples["runwatch_job_lost_steps_total"])
    resume = checkpoint_before(cfg, f.step - 1) + 1
    assert lost == f.step - resume
    ettr = [s.value for s in samples["runwatch_job_ettr"]]
    assert ettr[0] == 1.0 and min(ettr) < 0.9 and ettr[-1] < 1.0  # the stall, the wait and the lost steps
    # a restarted step shows what it showed the first time: the checkpoint restores the state exactly
    steps = [(s.value, s.timestamp) for s in samples["runwatch_train_step"]]
    losses = {}
    for (step, _), s in zip(steps, samples["runwatch_train_loss"], strict=True):
        assert losses.setdefault(step, s.value) == s.value
    assert [v for v, _ in steps].count(resume) == 2 and [v for v, _ in steps].count(f.step) == 1


def test_during_a_hang_the_struck_rank_is_one_collective_behind_and_the_last_step_time_freezes():
    cfg = cfg_of("hang")
    f = fault_of(cfg)
    run = simulate(cfg)
    stall_at = {float(t) for s, t in zip(run.samples, run.stamps(), strict=True) if s.state == "stall"}
    samples = scraped(cfg)
    seqs = {s.labels["rank"]: s.value for s in samples["runwatch_rank_collective_seq"] if s.timestamp == min(stall_at)}
    assert seqs == {str(r): f.step + (r != f.rank) for r in range(4)}
    frozen = {s.value for s in samples["runwatch_rank_last_step_timestamp_seconds"] if s.timestamp in stall_at}
    assert len(frozen) == 1 and frozen.pop() < min(stall_at)


def test_a_cluster_drill_hides_a_cluster_incident_half_the_time_by_llama_3s_shares():
    rng = random.Random(5)
    n = 20_000
    drawn = Counter(draw_drill(rng, cluster=True)["incident"] for _ in range(n))
    cluster = sum(drawn[i] for i in LLAMA3_SHARES)
    assert abs(cluster / n - 0.5) < 0.02
    total = sum(LLAMA3_SHARES.values())
    for incident, share in LLAMA3_SHARES.items():  # 47.6% crashes, 34.3% ECC, 16.0% hangs, 2.2% stragglers
        assert abs(drawn[incident] / cluster - share / total) < 0.02, incident
    # the plate's half: a healthy run 1 in 10 of them (trainer.config.HEALTHY_REDRAWN), each incident 9 in 40
    assert abs(drawn["none"] / n - 0.05) < 0.01
    assert all(abs(drawn[i] / n - 0.1125) < 0.015 for i in INCIDENTS if i != "none")
    one_rank = {draw_drill(rng)["incident"] for _ in range(2000)}
    assert one_rank == set(INCIDENTS)  # a run of one process draws only the plate's


def test_a_drill_is_healthy_one_time_in_ten_not_one_in_five():
    """A healthy drill is minutes with nothing to do: drawn again among the incidents half the time."""
    rng = random.Random(38)
    n = 20_000
    drawn = Counter(draw_drill(rng)["incident"] for _ in range(n))
    assert abs(drawn["none"] / n - 0.1) < 0.01, drawn
    assert all(abs(drawn[i] / n - 0.225) < 0.015 for i in INCIDENTS if i != "none"), drawn


@pytest.mark.integration
def test_a_cluster_drill_grades_the_rank_named(tmp_path):
    """`runwatch diagnose INCIDENT --rank R` against a drill's sealed answer: the incident, and the
    rank a cluster incident struck."""
    state, run_id = tmp_path / "state", "drill-120000"
    (state / "runs" / run_id).mkdir(parents=True)
    seal(state / "runs" / run_id / "answer.sealed", {"incident": "hang", "onset": 300, "run_id": run_id, "rank": 2})

    def diagnose(*args: str) -> str:
        record = {"run_id": run_id, "started_at": time.time(), "acks": [], "diagnosis": None}
        (state / "drill.json").write_text(json.dumps(record))
        (state / "scoreboard.jsonl").unlink(missing_ok=True)
        res = runwatch("diagnose", *args, "--state-dir", str(state), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert "CORRECT: you said hang; it was hang from step 300." in (out := diagnose("hang", "--rank", "2"))
    assert "you named rank 2: right, it was rank 2" in out
    assert "WRONG: you said rank_crash" in (out := diagnose("rank_crash", "--rank", "1"))
    assert "you named rank 1: wrong, it was rank 2" in out
    res = runwatch("diagnose", "hang", "--rank", "16", "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 2 and "--rank" in res.stderr and len(res.stderr.strip().splitlines()) == 1

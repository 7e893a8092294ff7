"""The lab's clock waits for its watcher (trainer.live's Watch), on a simulated clock.

A Prometheus that scrapes at every lab second's SCRAPE_PHASE, but for a gap, drives a live run
whose sleeps advance that clock: no real time passes. What is asserted is what the run does
while nobody watches (it holds), what it publishes (tokens/s of the device, never of the wait),
and where its incident starts when the alerts' baselines are not ready at the onset. The same
with real processes, a real Prometheus stopped with SIGSTOP and real pages: test_watch_e2e.py.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from runwatch.core.names import WATCH_GRACE_S
from runwatch.exporter.metrics import TrainerMetrics
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.live import SCRAPE_PHASE, RunRecord, Watch, run_live
from runwatch.trainer.record import StepRecord


class Prometheus:
    """A simulated clock and the scrapes it brings: one a second at k + SCRAPE_PHASE, none in
    [gap_from, gap_to). Duck-types exporter.server.MetricsServer's `scraped` and `last_scraped`."""

    def __init__(self, gap: tuple[float, float] = (float("inf"), float("inf"))):
        self.now, self.gap = 0.0, gap
        self.last_scraped: float | None = None
        self.scraped = self  # an Event whose wait() lets simulated time pass
        self._set = False
        self.scrapes: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        end = self.now + max(seconds, 0.0)
        nxt = int(self.now - SCRAPE_PHASE) + 1 + SCRAPE_PHASE  # the next scrape due after now
        while nxt <= end:
            self.now = nxt
            if not self.gap[0] <= nxt < self.gap[1]:
                self.last_scraped, self._set = nxt, True
                self.scrapes.append(nxt)
            nxt += 1.0
        self.now = end

    # threading.Event's surface, as trainer.live uses it
    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    def wait(self, timeout: float) -> bool:
        self.sleep(timeout)
        return self._set


class Recorded(TrainerMetrics):
    """The trainer's real metrics, keeping every step it published and when."""

    def __init__(self, cfg: TrainConfig, prom: Prometheus):
        super().__init__(cfg.label, cfg.seed, cfg.incident)
        self.prom, self.published = prom, []

    def observe(self, rec: StepRecord, tokens_per_second: float, wall_seconds: float | None = None) -> None:
        super().observe(rec, tokens_per_second, wall_seconds)
        self.published.append((self.prom.now, rec, tokens_per_second))


def live(tmp_path, cfg: TrainConfig, prom: Prometheus, ready=None, **kw):
    metrics, lines, moved = Recorded(cfg, prom), [], []
    record = RunRecord(tmp_path / "run.json", cfg, kw.pop("public", cfg))
    watch = Watch(prom, [prom], ready) if kw.pop("watched", True) else None
    status = run_live(
        cfg, metrics, record, stop=threading.Event(), log=lines.append, clock=prom.clock, sleep=prom.sleep,
        watch=watch, onset_moved=moved.append, **kw,
    )  # fmt: skip
    return status, metrics, lines, json.loads((tmp_path / "run.json").read_text()), moved


def test_a_gap_in_scraping_holds_the_clock_until_the_scrapes_return(tmp_path):
    cfg = TrainConfig(steps=80, onset=70, incident="slow_node", run_id="w")
    prom = Prometheus(gap=(20.0, 50.0))
    status, metrics, lines, record, _ = live(tmp_path, cfg, prom)
    assert status == "completed"
    published = metrics.published
    # No step ends in the gap but those of the grace: the last scrape before it came at 19.5 s.
    in_gap = [rec.step for t, rec, _ in published if 19.5 + WATCH_GRACE_S + 1 < t < 50.0]
    assert in_gap == []
    # Every step's tokens/s is its device's, so the wait cannot fire ThroughputDrop.
    assert all(tps == rec.tokens / rec.duration_seconds for _, rec, tps in published)
    waited = metrics.registry.get_sample_value("runwatch_train_watcher_wait_seconds_total", {"run_id": "w"})
    assert 50.0 - 19.5 - WATCH_GRACE_S - 1 <= waited <= 50.0 - 19.5 + 4  # the gap, less the grace, plus re-phasing
    paused = [line for line in lines if line.startswith("paused after step")]
    assert len(paused) == 1 and "Prometheus has not scraped for" in paused[0]
    assert any(line.startswith("resumed after step") for line in lines)
    assert record["paused_since"] is None and record["last_step"] == 79
    # Before the gap and after it, whole lab seconds fall SCRAPE_PHASE before a scrape: the clock
    # is set again against the scrapes that return, so the lab time of each step's end is its
    # time on the clock, to the second (within the 10 ms the trainer polls for a scrape).
    assert all(abs((t - rec.lab_time + 0.5) % 1.0 - 0.5) <= 0.01 + 1e-9 for t, rec, _ in published)


def test_unwatched_the_clock_runs_through_the_gap(tmp_path):
    cfg = TrainConfig(steps=60, onset=50, run_id="u")
    prom = Prometheus(gap=(20.0, 50.0))
    status, metrics, lines, record, _ = live(tmp_path, cfg, prom, watched=False)
    assert status == "completed"
    assert [rec.step for t, rec, _ in metrics.published if 25.0 < t < 45.0]  # it trained on, unseen
    assert not any("paused" in line for line in lines)


def test_the_onset_waits_for_the_baselines_and_the_record_says_by_how_much(tmp_path):
    cfg = TrainConfig(steps=60, onset=20, incident="corrupt_shard", run_id="o")
    prom = Prometheus()
    status, metrics, lines, record, moved = live(tmp_path, cfg, prom, ready=lambda: prom.now >= 31.0)
    assert status == "completed"
    first = next(rec.step for _, rec, _ in metrics.published if rec.incident_active)
    assert first > 20 and all(not rec.incident_active for _, rec, _ in metrics.published if rec.step < first)
    assert (record["config"]["onset"], record["onset_moved_by"]) == (first, first - 20)
    assert [m.onset for m in moved] == [first]
    assert f"onset moved {first - 20} steps, to step {first}" in "\n".join(lines)
    # The shard is read for its 30 steps from the real onset, as a run configured so reads it.
    assert sum(rec.incident_active for _, rec, _ in metrics.published) == min(cfg.corrupt_steps, 60 - first)


def test_baselines_ready_at_the_onset_move_nothing(tmp_path):
    cfg = TrainConfig(steps=40, onset=20, incident="lr_spike", run_id="r")
    status, metrics, lines, record, moved = live(tmp_path, cfg, Prometheus(), ready=lambda: True)
    assert next(rec.step for _, rec, _ in metrics.published if rec.incident_active) == 20
    assert "onset_moved_by" not in record and moved == []


def test_a_slow_answer_at_the_onset_sets_the_clock_again_rather_than_race(tmp_path):
    """Prometheus's answer (or the DNS lookup before it) takes 8 s at the onset. The steps owed
    are not trained back to back between two scrapes: the clock is set again, and every step
    after it is published a lab step apart, each read by a scrape of its own."""
    cfg = TrainConfig(steps=40, onset=20, incident="lr_spike", run_id="s")
    prom = Prometheus()

    def slow_ready() -> bool:
        prom.sleep(8.0)
        return True

    _, metrics, lines, record, _ = live(tmp_path, cfg, prom, ready=slow_ready)
    times = [t for t, rec, _ in metrics.published if rec.step >= 20]
    assert all(b - a > 0.9 for a, b in zip(times, times[1:], strict=False)), times
    # no two of them between the same pair of scrapes
    assert len({int(t - SCRAPE_PHASE) for t in times}) == len(times)
    assert any("the clock fell 8 s behind" in line for line in lines)
    assert next(rec.step for _, rec, _ in metrics.published if rec.incident_active) == 20  # ready: not moved


def test_prometheus_gone_while_the_clock_is_set_again_is_a_hold_the_run_says(tmp_path):
    """The answer at the onset takes 3 s, and Prometheus goes away during it for 30 s. Setting
    the clock again, the run finds nobody scraping: it holds as for any gap (says so, records
    paused_since, counts the wait), instead of waiting for scrapes with no word."""
    cfg = TrainConfig(steps=40, onset=20, incident="lr_spike", run_id="g")
    prom = Prometheus()
    paused: list[str | None] = []

    def slow_ready() -> bool:
        if prom.gap[0] == float("inf"):  # the first answer; asked again after the hold
            prom.gap = (prom.now + 1.0, prom.now + 31.0)
        prom.sleep(3.0)
        return True

    class Seen(RunRecord):
        def save(self, **changes):
            if "paused_since" in changes:
                paused.append(changes["paused_since"])
            super().save(**changes)

    metrics, lines = Recorded(cfg, prom), []
    record = Seen(tmp_path / "run.json", cfg, cfg)
    status = run_live(cfg, metrics, record, stop=threading.Event(), log=lines.append, clock=prom.clock,
                      sleep=prom.sleep, watch=Watch(prom, [prom], slow_ready))  # fmt: skip
    assert status == "completed"
    assert len(paused) == 2 and paused[0] and paused[1] is None, paused
    fell = lines.index("the clock fell 3 s behind; setting it against the scrapes again")
    assert lines[fell + 1].startswith("paused after step 19: Prometheus has not scraped for"), lines
    gap = prom.gap
    assert [t for t, rec, _ in metrics.published if gap[0] + WATCH_GRACE_S + 1 < t < gap[1]] == []
    waited = metrics.registry.get_sample_value("runwatch_train_watcher_wait_seconds_total", {"run_id": "g"})
    assert waited >= gap[1] - gap[0] - WATCH_GRACE_S - 1
    assert next(rec.step for _, rec, _ in metrics.published if rec.incident_active) == 20


def test_a_drill_moves_its_onset_in_its_sealed_answer_only(tmp_path):
    cfg = TrainConfig(steps=60, onset=20, incident="repeated_batch", run_id="d", drill=True)
    public = dataclasses.replace(cfg, incident="hidden", onset=-1)  # as runwatch train records a drill
    prom = Prometheus()
    _, _, lines, record, moved = live(tmp_path, cfg, prom, ready=lambda: prom.now >= 25.0, public=public)
    assert len(moved) == 1 and moved[0].onset > 20  # the caller seals this
    assert "onset_moved_by" not in record and record["config"]["onset"] == -1
    assert not any("onset" in line for line in lines)


def test_a_healthy_run_never_asks_for_its_baselines(tmp_path):
    asked = []
    cfg = TrainConfig(steps=30, onset=10, incident="none", run_id="h")
    live(tmp_path, cfg, Prometheus(), ready=lambda: asked.append(1) or False)
    assert asked == []


@pytest.mark.integration  # the lab's components ask the binaries their versions
def test_the_lab_s_trainer_waits_for_prometheus_unless_told_not_to(tmp_path):
    """`runwatch up` starts its trainer and control watched, asking the lab's own Prometheus for
    the baselines; `--no-wait-for-prometheus` starts them as a real, unwatched job runs."""
    import argparse

    from runwatch.lab.supervise import Lab
    from runwatch.lab.up import add_arguments as add_up

    parser = argparse.ArgumentParser()
    add_up(parser)
    lab = Lab(tmp_path / "state")
    for flags, watched in [([], True), (["--no-wait-for-prometheus"], False)]:
        args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--control", *flags])
        for comp in lab.components(args, "none-0-120000")[:2]:  # the trainer and its control
            assert ("--wait-for-prometheus" in comp.argv) is watched, comp.argv
            if watched:
                assert comp.argv[comp.argv.index("--prometheus") + 1] == lab.url("prometheus")

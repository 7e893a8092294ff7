"""runwatch.watch, the client of a user's own training loop: the lab's names and labels, read back
from a fresh registry as prometheus_client's own tests do. No torch here (tests/test_watch_client_torch.py
has the real thing); the client takes plain numbers.
"""

from __future__ import annotations

import argparse
import re
import socket
import threading
import time

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

from runwatch.core.command import UsageError
from runwatch.core.paths import REPO
from runwatch.lab.watched import check_watch, watch_targets
from runwatch.prom.server import free_port
from runwatch.watch import QUEUED, REQUEST_DEADLINE_S, WORKERS, Watch, WatchError
from tests.conftest import wait_for

RUN = {"run_id": "r"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(clock: Clock | None = None, **kw) -> Watch:
    kw.setdefault("env", {})
    return Watch("r", registry=CollectorRegistry(), clock=clock or Clock(), wall=lambda: 1.7e9, **kw)


def value(w: Watch, name: str, **labels: str) -> float | None:
    return w.registry.get_sample_value(name, labels or RUN)


def test_a_step_publishes_the_labs_training_series():
    clock = Clock()
    w = watch(clock)
    assert value(w, "runwatch_train_step") is None  # nothing trained yet: no step to judge
    w.begin()
    clock.now += 0.5
    w.step(7, 2.5, tokens=1000, gradient_norm=1.5, learning_rate=0.1)
    assert value(w, "runwatch_train_step") == 7
    assert value(w, "runwatch_train_loss") == 2.5
    assert value(w, "runwatch_train_gradient_norm") == 1.5
    assert value(w, "runwatch_train_learning_rate") == 0.1
    assert value(w, "runwatch_train_tokens_total") == 1000
    assert value(w, "runwatch_train_tokens_per_second") == 2000  # 1000 tokens over 0.5 s
    assert value(w, "runwatch_train_step_duration_seconds_count") == 1
    assert value(w, "runwatch_train_step_duration_seconds_bucket", run_id="r", le="0.5") == 1
    assert value(w, "runwatch_train_run_info", run_id="r", seed="", incident="none") == 1
    assert value(w, "runwatch_train_run_start_time_seconds") == 1.7e9
    assert value(w, "runwatch_train_heldout_loss") is None  # never evaluated: never published


def test_a_step_without_begin_starts_where_the_last_ended():
    clock = Clock()
    w = watch(clock)
    w.step(0, 1.0, tokens=10)
    clock.now += 0.25
    w.step(1, 1.0, tokens=10)
    assert value(w, "runwatch_train_tokens_per_second") == 40
    assert value(w, "runwatch_train_tokens_total") == 20


def test_heldout_loss_stays_until_the_next_evaluation():
    w = watch()
    w.heldout(0.75)
    w.step(0, 1.0)
    w.step(1, 1.1)
    assert value(w, "runwatch_train_heldout_loss") == 0.75
    w.heldout(0.5)
    assert value(w, "runwatch_train_heldout_loss") == 0.5


def test_steps_reported_at_once_count_their_mean_duration():
    clock = Clock()
    w = watch(clock)
    clock.now += 0.04
    w.step(10, 1.0, tokens=400, steps=10)  # a trainer that logs every 10 steps
    assert value(w, "runwatch_train_step_duration_seconds_count") == 10
    assert value(w, "runwatch_train_step_duration_seconds_bucket", run_id="r", le="0.005") == 10
    assert value(w, "runwatch_train_tokens_per_second") == pytest.approx(10_000)
    with pytest.raises(WatchError, match=r"steps: must be in \[1, 2\*\*53\], got 0"):
        w.step(11, 1.0, steps=0)


def test_begin_every_step_and_a_report_every_k_steps_give_the_true_rate():
    """Issue 37, item 6: begin() each step and step(steps=k) every k steps reported k steps'
    tokens over the last step's time alone (13x at k=16). The report runs from its first begin."""
    clock = Clock()
    w = watch(clock)
    for _ in range(16):
        clock.now += 0.005  # between steps: not the step's (a report's first begin starts it)
        w.begin()
        clock.now += 0.045  # the step itself
    w.step(15, 1.0, tokens=16 * 1000, steps=16)
    # 16 steps of 45 ms and the 15 gaps of 5 ms between them: 0.795 s
    assert value(w, "runwatch_train_tokens_per_second") == pytest.approx(16_000 / 0.795)
    assert value(w, "runwatch_train_step_duration_seconds_sum") == pytest.approx(0.795)
    assert value(w, "runwatch_train_step_duration_seconds_count") == 16


def test_a_reports_gradient_norm_is_the_largest_of_its_steps():
    w = watch()
    w.step(3, 1.0, gradient_norm=[1.0, 7.5, 2.0], steps=3)
    assert value(w, "runwatch_train_gradient_norm") == 7.5
    w.step(6, 1.0, gradient_norm=(1.0, float("nan"), 2.0), steps=3)  # an explosion in any step is the report's
    assert value(w, "runwatch_train_gradient_norm") != value(w, "runwatch_train_gradient_norm")  # NaN
    w.step(7, 1.0, gradient_norm=4)
    assert value(w, "runwatch_train_gradient_norm") == 4.0


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        (("three", 1.0), {}, "step: must be a whole number, got 'three'"),
        ((None, 1.0), {}, "step: must be a whole number, got None"),
        ((2.5, 1.0), {}, "step: must be a whole number, got 2.5"),
        ((True, 1.0), {}, "step: must be a whole number, got True"),
        ((10**400, 1.0), {}, r"step: must be in \[0, 2\*\*53\], got 1000"),
        ((-1, 1.0), {}, r"step: must be in \[0, 2\*\*53\], got -1"),
        ((1, "x"), {}, "loss: must be a number, got 'x'"),
        ((1, None), {}, "loss: must be a number, got None"),
        ((1, 1.0), {"tokens": -5}, r"tokens: must be in \[0, 2\*\*53\], got -5"),
        ((1, 1.0), {"tokens": 1.5}, "tokens: must be a whole number, got 1.5"),
        ((1, 1.0), {"gradient_norm": "big"}, "gradient_norm: must be a number, got 'big'"),
        ((1, 1.0), {"gradient_norm": []}, "gradient_norm: an empty sequence"),
        ((1, 1.0), {"learning_rate": 10**400}, "learning_rate: must be a number"),
    ],
)
def test_bad_step_arguments_are_refused_naming_them_and_scrapes_stay_whole(args, kw, message):
    """Issue 40, N22: w.step("three" / None / 10**400, 1.0) was accepted, then every scrape was a 500."""
    w = watch()
    w.step(0, 1.0)
    with pytest.raises(WatchError, match=message):
        w.step(*args, **kw)
    assert value(w, "runwatch_train_step") == 0 and generate_latest(w.registry)  # the refused call left no trace


def test_finish_stops_the_per_step_values_and_keeps_the_facts():
    w = watch()
    w.step(3, 1.0, tokens=5, gradient_norm=1.0)
    w.finish()
    assert value(w, "runwatch_train_step") == 3
    assert value(w, "runwatch_train_loss") is None and value(w, "runwatch_train_gradient_norm") is None
    assert value(w, "runwatch_train_tokens_total") == 5
    assert value(w, "runwatch_train_run_end_time_seconds") == 1.7e9


def test_every_rank_serves_its_compute_and_wait_and_only_rank_0_the_jobs_series():
    clock = Clock()
    ranks = [watch(clock, rank=r, world_size=2, node="n0") for r in (0, 1)]
    for w, compute in zip(ranks, (1.0, 1.4), strict=True):
        start = clock.now
        w.begin()
        clock.now = start + compute
        w.exchange()
        clock.now = start + 1.45
        w.step(5, 0.3, tokens=64)
        clock.now = start
    labels = [{"run_id": "r", "rank": str(r), "node": "n0"} for r in (0, 1)]
    assert value(ranks[0], "runwatch_rank_last_compute_seconds", **labels[0]) == pytest.approx(1.0)
    assert value(ranks[0], "runwatch_rank_last_collective_wait_seconds", **labels[0]) == pytest.approx(0.45)
    assert value(ranks[1], "runwatch_rank_last_compute_seconds", **labels[1]) == pytest.approx(1.4)
    assert value(ranks[1], "runwatch_rank_compute_seconds_total", **labels[1]) == pytest.approx(1.4)
    assert value(ranks[1], "runwatch_rank_collective_wait_seconds_total", **labels[1]) == pytest.approx(0.05)
    assert value(ranks[1], "runwatch_rank_last_step_seconds", **labels[1]) == pytest.approx(1.45)
    assert value(ranks[1], "runwatch_rank_step", **labels[1]) == 5
    assert value(ranks[1], "runwatch_rank_last_step_timestamp_seconds", **labels[1]) == 1.7e9
    assert value(ranks[1], "runwatch_rank_collective_seq", **labels[1]) == 1
    assert value(ranks[0], "runwatch_train_loss") == 0.3
    assert value(ranks[1], "runwatch_train_loss") is None and value(ranks[1], "runwatch_train_run_info") is None


def test_one_process_serves_no_rank_series():
    w = watch()
    w.exchange()
    w.step(0, 1.0)
    assert "runwatch_rank_" not in generate_latest(w.registry).decode()


def test_rank_world_restarts_and_run_id_come_from_torchruns_environment():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "job7",
           "TORCHELASTIC_RESTART_COUNT": "2"}  # fmt: skip
    w = Watch(registry=CollectorRegistry(), env=env)
    assert (w.rank, w.world_size, w.local_rank, w.run_id) == (1, 2, 1, "job7")
    zero = Watch(registry=CollectorRegistry(), env={**env, "RANK": "0", "LOCAL_RANK": "0"})
    assert zero.registry.get_sample_value("runwatch_job_restarts_total", {"run_id": "job7"}) == 2
    assert Watch(registry=CollectorRegistry(), env={**env, "RUNWATCH_RUN_ID": "mine"}).run_id == "mine"
    one = Watch(registry=CollectorRegistry(), env={})
    assert re.fullmatch(r".+-\d{6}", one.run_id) and one.registry.get_sample_value(
        "runwatch_job_restarts_total", {"run_id": one.run_id}) is None  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"env": {"WORLD_SIZE": "2", "RANK": "0"}}, "run_id: ranks must share one"),
        ({"env": {"RANK": "x"}}, "RANK: must be an integer, got 'x'"),
        ({"env": {}, "rank": 2, "world_size": 2, "run_id": "r"}, r"rank: must be in \[0, world_size\), got rank 2"),
        ({"env": {}, "world_size": 0, "run_id": "r"}, "rank: must be in"),
        ({"env": {}, "run_id": ""}, "run_id: must not be empty"),
    ],
)
def test_bad_settings_are_refused_naming_them(kw, message):
    with pytest.raises(WatchError, match=message):
        Watch(registry=CollectorRegistry(), **kw)


def test_it_starts_no_thread_until_asked_to_serve_and_then_a_bounded_server(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = threading.active_count()
    w = Watch("r", registry=CollectorRegistry(), env={"LOCAL_RANK": "1"})
    for s in range(100):
        w.step(s, 1.0, tokens=1)
    assert threading.active_count() == before and list(tmp_path.iterdir()) == []  # no thread, no file
    base = free_port()
    port = w.serve(base - 1)  # local rank 1: base - 1 + 1
    assert port == base
    assert f"runwatch.watch: run r rank 0 serves http://127.0.0.1:{port}/metrics" in capsys.readouterr().err
    assert 'runwatch_train_step{run_id="r"} 99.0' in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert w.scrapes == 1
    assert threading.active_count() <= before + 1 + WORKERS  # the listener, and the pool's workers at most
    with pytest.raises(WatchError, match=rf"port: cannot serve on 127.0.0.1:{port}: "):
        Watch("r2", registry=CollectorRegistry(), env={}).serve(port)


def test_a_local_rank_past_the_last_port_is_refused_naming_it():
    """Issue 40, N22: LOCAL_RANK=70000 gave an OverflowError."""
    w = Watch("r", registry=CollectorRegistry(), env={"LOCAL_RANK": "70000"})
    with pytest.raises(WatchError, match=r"port: 8000 \+ LOCAL_RANK 70000 = 78000, not a TCP port"):
        w.serve(8000)


def closed(s: socket.socket) -> bool:
    """Whether the server has closed this connection (its end read), without waiting."""
    timeout = s.gettimeout()
    s.settimeout(0)  # a socket with a timeout waits for it before it reads, whatever the flags
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    finally:
        s.settimeout(timeout)


def test_stalled_connections_cost_no_thread_each_and_are_cut_at_their_deadline():
    """Issue 40, N23: 3,000 stalled connections to prometheus_client's server made 3,002 threads,
    all still open 426 s later. Here 300 are held open, sending nothing."""
    w = Watch("r", registry=CollectorRegistry(), env={})
    before = threading.active_count()
    port = w.serve(free_port())
    stalled = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
    try:
        # every connection accepted or refused: all but the workers' and the queue's closed at once
        wait_for(lambda: sum(map(closed, stalled)) >= 300 - WORKERS - QUEUED, REQUEST_DEADLINE_S, "the refusals")
        assert threading.active_count() <= before + 1 + WORKERS
        # the ones a worker holds are cut at their deadline (checked every 0.5 s poll)
        held = next(s for s in stalled if not closed(s))
        held.settimeout(REQUEST_DEADLINE_S + 1.5)
        assert held.recv(1) == b""
    finally:
        for s in stalled:
            s.close()
    # the deadline freed every worker: a scrape is answered
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=REQUEST_DEADLINE_S + 1).status_code == 200


def test_finish_waits_for_the_scrape_that_sees_the_end():
    """Issue 37, item 1: a job that exits right after finish() must have had its end scraped,
    or TrainerDown cannot tell it from a crash."""
    w = Watch("r", registry=CollectorRegistry(), env={})
    port = w.serve(free_port())
    w.step(0, 1.0)
    requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    seen: list[str] = []
    scraper = threading.Timer(
        0.3, lambda: seen.append(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
    )
    scraper.start()
    w.finish()
    returned_after = w.scrapes  # finish() returns once the scrape after the end has been served
    scraper.join()
    assert returned_after == 2 and 'runwatch_train_run_end_time_seconds{run_id="r"}' in seen[0]
    start = time.monotonic()
    Watch("q", registry=CollectorRegistry(), env={}).finish()  # never served: no wait
    assert time.monotonic() - start < 0.1


# What a user's loop cannot give: Lesson 20's logits, weights, expected curve and loss scale (the
# lab's own model), the GPU's DCGM series, the launcher's lost steps and ETTR, and the lab's own
# checkpoint and incident flag. Everything else the rules read, the client serves.
NOT_FROM_A_LOOP = {"runwatch_train_logit_norm_max", "runwatch_train_loss_scale", "runwatch_job_lost_steps_total",
                   "runwatch_job_ettr"}  # fmt: skip


def test_the_client_serves_every_series_the_training_and_cluster_rules_read():
    files = ("alerts.yml", "baselines.yml", "cluster.yml")
    rules = "".join((REPO / "prometheus" / "rules" / f).read_text() for f in files)
    read = set(re.findall(r"(?<![:\w])(runwatch_(?:train|rank|job)_[a-z_]+)\b", rules)) - NOT_FROM_A_LOOP
    w = Watch("r", rank=0, world_size=2, registry=CollectorRegistry(), env={"TORCHELASTIC_RESTART_COUNT": "0"})
    w.heldout(1.0)
    w.exchange()
    w.step(0, 1.0, tokens=1, gradient_norm=1.0, learning_rate=0.1)
    names = re.compile(r"^(runwatch_\w+?)(?:\{| )", re.M)
    served = set(names.findall(generate_latest(w.registry).decode()))
    w.finish()  # a finished run serves its end time (TrainingStalled reads it)
    served |= set(names.findall(generate_latest(w.registry).decode()))
    assert read and read <= served, read - served


# --- `runwatch up --watch`: its addresses, and what it refuses ---


def test_watch_takes_addresses_or_a_file_of_them(tmp_path):
    assert watch_targets("127.0.0.1:8000, host-2.lan:08001") == ["127.0.0.1:8000", "host-2.lan:8001"]
    targets = tmp_path / "targets.txt"
    targets.write_text("# my job's ranks\n127.0.0.1:8000\n\n127.0.0.1:8001  # rank 1\n")
    assert watch_targets(str(targets)) == ["127.0.0.1:8000", "127.0.0.1:8001"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1", "127.0.0.1: neither HOST:PORT"),
        ("127.0.0.1:0", "'127.0.0.1:0' is not HOST:PORT"),
        ("127.0.0.1:65536", "'127.0.0.1:65536' is not HOST:PORT"),
        (":8000", "':8000' is not HOST:PORT"),
        ("a b:8000", "'a b:8000' is not HOST:PORT"),
        ("127.0.0.1:8000,", "'' is not HOST:PORT"),
        ("127.0.0.1:8000,127.0.0.1:8000", "names an address twice"),
    ],
)
def test_bad_addresses_are_refused_naming_them(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        watch_targets(text)


def test_too_many_addresses_are_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="257 addresses, more than 256"):
        watch_targets(",".join(f"h:{p}" for p in range(1, 258)))


def test_a_bad_targets_file_is_refused_naming_the_file_and_line(tmp_path):
    bad = tmp_path / "t.txt"
    bad.write_text("127.0.0.1:8000\nnot an address\n")
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"{bad}, line 2: 'not an address' is not")):
        watch_targets(str(bad))
    bad.write_text("# nothing\n")
    with pytest.raises(argparse.ArgumentTypeError, match="names no HOST:PORT"):
        watch_targets(str(bad))
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"{bad}: a file of addresses is not UTF-8 text")):
        watch_targets(str(bad))
    with pytest.raises(argparse.ArgumentTypeError, match="a file of addresses is not a regular file"):
        watch_targets(str(tmp_path))  # a directory (a FIFO or /dev/zero: tests/test_hostile_files.py)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("incident", "lr_spike"), ("control", True), ("ranks", 2), ("fast_forward", 270), ("onset", 5),
     ("precision", "fp16")],
)  # fmt: skip
def test_watch_refuses_the_labs_own_trainer_flags(flag, value):
    args = argparse.Namespace(watch=["127.0.0.1:8000"], **{flag: value})
    with pytest.raises(UsageError, match=f"--watch: the lab's own trainer does not run, so --{flag.replace('_', '-')}"):
        check_watch(args)

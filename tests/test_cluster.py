"""Data-parallel training over N ranks: the arithmetic, the clock of each rank, its GPU, and a
live run over a real MPI (MPICH's mpiexec, mpi4py) that matches the offline simulation bit for bit."""

import argparse
import json
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from runwatch.cluster.launcher import write_targets
from runwatch.core.command import UsageError
from runwatch.core.names import WATCH_GRACE_S
from runwatch.core.paths import REPO
from runwatch.prom.server import Process, free_port, free_ports_in_a_row, instant, prometheus_argv
from runwatch.trainer import model, parallel
from runwatch.trainer.config import INCIDENTS, ConfigError, TrainConfig
from runwatch.trainer.faults import fault_of
from runwatch.trainer.gpu import NOMINAL_SM_MHZ, gpu_index, gpu_state, gpu_uuid, node_of
from runwatch.trainer.run import Trainer, compute_seconds, step_durations, struck_rank
from tests.conftest import holds, need, runwatch, wait_for


def test_the_ranks_shares_average_to_the_whole_batchs_gradient():
    cfg = TrainConfig(ranks=4)
    rng = np.random.default_rng(1)
    w, b = rng.normal(size=(20, 10)), rng.normal(size=10)
    x, y = model.sample(rng, model.class_means(cfg), 64, 4.0)
    loss, g_w, g_b, logits = parallel.combine([parallel.share_gradient(w, b, x, y, cfg, r) for r in range(4)])
    whole = model.forward_backward(w, b, x, y)
    assert abs(loss - whole[0]) < 1e-12 and np.allclose(g_w, whole[1], atol=1e-12, rtol=0)
    assert np.allclose(g_b, whole[2], atol=1e-12, rtol=0) and np.array_equal(logits, whole[3])
    assert [parallel.share(cfg, r) for r in (0, 3)] == [slice(0, 16), slice(48, 64)]


def test_a_part_crosses_the_wire_unchanged():
    cfg = TrainConfig(ranks=2)
    rng = np.random.default_rng(2)
    part = (0.25, rng.normal(size=(20, 10)), rng.normal(size=10), rng.normal(size=(32, 10)))
    vector = parallel.pack(part)
    assert vector.size == 1 + 20 * 10 + 10 + 32 * 10  # loss, g_w, g_b, the share's logits
    back = parallel.unpack(vector, cfg)
    assert back[0] == part[0] and all(np.array_equal(a, b) for a, b in zip(back[1:], part[1:], strict=True))


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_the_plates_runs_keep_their_shape_at_any_number_of_ranks(ranks):
    """Averaging in another order moves the series by rounding only: within 1e-9 of one process
    over the whole run, for each of the plate's incidents."""
    for incident in INCIDENTS:
        one = Trainer(TrainConfig(seed=7, incident=incident)).run()
        many = Trainer(TrainConfig(seed=7, incident=incident, ranks=ranks)).run()
        for field in ("loss", "heldout_loss", "gradient_norm"):
            a, b = (np.array([getattr(r, field) for r in run]) for run in (one, many))
            assert np.abs(a - b).max() < 1e-9, (incident, field)


def test_a_straggler_slows_its_rank_and_through_it_the_job():
    cfg = TrainConfig(ranks=4, incident="straggler", seed=3)
    slow = struck_rank(cfg)
    seconds, healthy = compute_seconds(cfg), compute_seconds(TrainConfig(ranks=4, seed=3))
    assert np.array_equal(seconds[:, :300], healthy[:, :300])
    assert np.allclose(seconds[slow, 300:], healthy[slow, 300:] / 0.7)
    others = [r for r in range(4) if r != slow]
    assert np.array_equal(seconds[others, 300:], healthy[others, 300:])
    assert np.array_equal(step_durations(cfg), seconds.max(axis=0) + cfg.collective_seconds)
    assert np.median(step_durations(cfg)[300:]) > 1.35  # the whole job waits for the straggler


def test_on_a_slow_node_every_rank_slows_and_none_stands_out():
    seconds = compute_seconds(TrainConfig(ranks=4, incident="slow_node", seed=3))
    healthy = compute_seconds(TrainConfig(ranks=4, seed=3))
    assert np.allclose(seconds[:, 300:], healthy[:, 300:] / 0.7)


def test_one_rank_keeps_the_one_process_clock():
    cfg = TrainConfig(seed=5, incident="slow_node")
    assert compute_seconds(cfg).shape == (1, 600) and step_durations(cfg)[0] == compute_seconds(cfg)[0, 0]


def test_the_straggler_s_gpu_runs_hot_and_throttled():
    cfg = TrainConfig(ranks=4, incident="straggler", seed=3)
    slow = struck_rank(cfg)
    before, after = gpu_state(cfg, slow, 299), gpu_state(cfg, slow, 300)
    assert before.sm_clock_mhz == NOMINAL_SM_MHZ and after.sm_clock_mhz == NOMINAL_SM_MHZ * 0.7
    assert before.temp_c < 70 < 85 < after.temp_c and after.power_w < before.power_w
    healthy = gpu_state(cfg, (slow + 1) % 4, 400)
    assert healthy.sm_clock_mhz == NOMINAL_SM_MHZ and healthy.temp_c < 70 and healthy.xid == 0
    assert gpu_uuid(cfg, 0) != gpu_uuid(cfg, 1) and gpu_uuid(cfg, 2) == gpu_uuid(TrainConfig(ranks=4), 2)


@pytest.mark.parametrize(
    "changes, field",
    [({"ranks": 3}, "ranks"), ({"ranks": 0}, "ranks"), ({"incident": "straggler"}, "incident"),
     ({"ranks": 2, "precision": "fp16"}, "precision"), ({"ranks": 2, "straggler_clock": 0.0}, "straggler_clock")],
)  # fmt: skip
def test_configs_a_cluster_cannot_run_name_their_field(changes, field):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**changes).validate()
    assert err.value.field == field


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, flag",
    [(["--ranks", "3", "--offline", "--out", "x.om"], "--ranks"), (["--ranks", "99"], "--ranks"),
     (["--incident", "straggler", "--offline", "--out", "x.om"], "--incident"),
     (["--ranks", "2", "--watchdog-seconds", "0"], "--watchdog-seconds"),
     (["--ranks", "2", "--restart-seconds", "1e9"], "--restart-seconds")],
)  # fmt: skip
def test_bad_cluster_flags_are_one_line_errors(tmp_path, args, flag):
    res = runwatch("train", *args, cwd=tmp_path)
    assert res.returncode == 2, (args, res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, no run directory


# --- live, over MPI ---


# a live run of id rk, on any free ports
LIVE = [sys.executable, "-m", "runwatch", "train", "--port", "0", "--rank-port-base", "0", "--launcher-port", "0",
        "--run-id", "rk"]  # fmt: skip


def live(tmp_path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    argv = [*LIVE, "--run-dir", str(tmp_path / "run"), *args]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_a_live_run_over_mpi_is_the_offline_simulation_bit_for_bit(tmp_path):
    """Two rank processes exchanging their parts over MPICH: the weights after 50 steps, and the
    training loss of steps 10-49 (the expected-loss fit's window), equal one process simulating them."""
    res = live(tmp_path, "--ranks", "2", "--steps", "50", "--onset", "20", "--incident", "straggler",
               "--step-seconds", "0.02", "--hold", "0")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "run rk: completed" in res.stdout
    saved = np.load(tmp_path / "run" / "checkpoints" / "checkpoint-000049.npz")
    offline = Trainer(TrainConfig(ranks=2, steps=50, onset=20, incident="straggler", step_seconds=0.02, run_id="rk"))
    offline.run()
    assert np.array_equal(saved["w"], offline.w) and np.array_equal(saved["b"], offline.b)
    assert np.array_equal(saved["fit_losses"], np.array(offline.fit_losses))
    assert (tmp_path / "run" / "run.json").exists() and (tmp_path / "run" / "rank-1.json").exists()


@pytest.mark.integration
def test_the_live_ranks_wait_for_the_straggler(tmp_path):
    """Four ranks, one a straggler from step 10 of 40: each rank's own /metrics, read once the run
    is over, shows who computed longer and who waited. Bounds follow from the config: a step of
    0.1 s, 1/0.7 of it on the straggler, jitter 2% (6% at three sigmas)."""
    cfg = TrainConfig(ranks=4, incident="straggler", onset=10, steps=40, step_seconds=0.1, run_id="rk")
    proc = subprocess.Popen(
        [*LIVE, "--run-dir", str(tmp_path / "run"), "--ranks", "4", "--incident", "straggler", "--onset", "10",
         "--steps", "40", "--step-seconds", "0.1", "--hold", "30"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        urls, seen = {}, ""
        while "run rk: completed" not in seen:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            seen += line
            m = re.match(r"run rk rank (\d): serving (http://[0-9.:]+/metrics)$", line)
            if m and m[1] not in urls:  # a rank's own server is the first it names
                urls[m[1]] = m[2]
        # rank 0 says completed once its last exchange is done; the others record theirs a moment later
        metrics = wait_for(lambda: all_at_step(urls, 39), 30, "every rank to record step 39")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    slow = struck_rank(cfg)
    compute = {r: m["runwatch_rank_compute_seconds_total"] for r, m in metrics.items()}
    wait = {r: m["runwatch_rank_collective_wait_seconds_total"] for r, m in metrics.items()}
    assert all(m["runwatch_rank_collective_seq"] == 40 and m["runwatch_rank_step"] == 39 for m in metrics.values())
    # 30 throttled steps: the straggler computes at least 30 x 0.1/0.7 x 0.94 = 4.03 s in all
    assert compute[slow] >= 10 * 0.1 * 0.94 + 30 * 0.1 / 0.7 * 0.94
    for r in set(metrics) - {slow}:
        assert compute[r] < compute[slow] - 30 * (0.1 / 0.7 * 0.94 - 0.1 * 1.06) / 2, (r, compute)
        assert wait[r] > wait[slow], (r, wait)
        assert metrics[r]["DCGM_FI_DEV_SM_CLOCK"] == NOMINAL_SM_MHZ
    assert metrics[slow]["DCGM_FI_DEV_SM_CLOCK"] == NOMINAL_SM_MHZ * 0.7
    assert metrics[slow]["DCGM_FI_DEV_GPU_TEMP"] > 85


def all_at_step(urls: dict[str, str], step: int) -> dict[int, dict[str, float]] | None:
    metrics = {int(r): scrape(u) for r, u in urls.items()}
    return metrics if all(m["runwatch_rank_step"] == step for m in metrics.values()) else None


def scrape(url: str) -> dict[str, float]:
    text = requests.get(url, timeout=5).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.integration
def test_offline_the_ranks_are_simulated_in_one_process(tmp_path):
    res = runwatch("train", "--offline", "--ranks", "4", "--incident", "straggler", "--steps", "20", "--onset", "10",
                   "--out", "run.om", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert 'run_id="straggler-0"' in (tmp_path / "run.om").read_text()


@pytest.mark.integration
def test_ctrl_c_stops_every_rank_and_leaves_none_behind(tmp_path):
    """Ctrl-C to the launcher reaches mpiexec once, every rank stops mid-run (one may be waiting in
    an exchange), run.json says interrupted, and no process of the run is left: followed through
    the launcher's own descendants, never a machine-wide search."""
    proc = subprocess.Popen(
        [*LIVE, "--run-dir", str(tmp_path / "run"), "--ranks", "4", "--steps", "600", "--onset", "5",
         "--incident", "straggler", "--step-seconds", "0.2"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )  # fmt: skip
    seen = ""
    while "step   10" not in seen:  # rank 0 logs every 10 steps: by then the straggler has slowed it
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        seen += line
    family = psutil.Process(proc.pid).children(recursive=True)
    assert sum(p.name().startswith("python") for p in family) == 4, [p.name() for p in family]
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


@pytest.mark.slow  # live ranks, Prometheus, Alertmanager and a pager of their own, 30 s
@pytest.mark.integration
def test_a_live_straggler_pages_naming_its_rank_and_its_gpu(tmp_path):
    """Four live ranks, a straggler from step 5, scraped each second by a real Prometheus with
    cluster.yml: StragglerRank fires naming the straggler's rank and node, GPUThermalThrottle its
    GPU; no other rank is named. With so few samples yet, its median turns some 6 s after the
    onset (once 10 are in the window), then `for: 5s`."""
    cfg = TrainConfig(ranks=4, incident="straggler", onset=5, steps=120, run_id="rk")
    proc = subprocess.Popen(
        [*LIVE, "--run-dir", str(tmp_path / "run"), "--ranks", "4", "--incident", "straggler", "--onset", "5",
         "--steps", "120"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        targets: dict[int, str] = {}
        while len(targets) < 4:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            m = re.match(r"run rk rank (\d): serving http://([0-9.:]+)/metrics$", line)
            if m and int(m[1]) not in targets:
                targets[int(m[1])] = m[2]
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{REPO / 'prometheus' / 'rules' / 'cluster.yml'}]\n"
            f"scrape_configs: [{{job_name: ranks, static_configs: [{{targets: {list(targets.values())}}}]}}]\n"
        )
        argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
        with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
            # onset 5 s + up to 15 s for the median + 5 s of for: + scrapes: a minute and a half is ample
            firing = wait_for(lambda: names_firing(port, {"StragglerRank", "GPUThermalThrottle"}), 90, "both alerts")
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    slow = struck_rank(cfg)
    [straggler] = firing["StragglerRank"]
    assert (straggler["rank"], straggler["node"], straggler["run_id"]) == (str(slow), node_of(cfg, slow), "rk")
    [gpu] = firing["GPUThermalThrottle"]
    assert (gpu["Hostname"], gpu["gpu"], gpu["UUID"]) == (
        node_of(cfg, slow),
        str(gpu_index(cfg, slow)),
        gpu_uuid(cfg, slow),
    )


def names_firing(port: int, names: set[str]) -> dict[str, list[dict]] | None:
    """The labels of every firing alert by name, once each of `names` fires."""
    alerts = requests.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    out: dict[str, list[dict]] = {}
    for a in alerts:
        if a["state"] == "firing":
            out.setdefault(a["labels"]["alertname"], []).append(a["labels"])
    return out if names <= set(out) else None


@pytest.mark.integration
def test_a_busy_rank_port_is_refused_before_any_rank_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = runwatch("train", "--ranks", "2", "--rank-port-base", str(port), "--port", "0", "--steps", "5",
                       "--onset", "1", "--run-dir", "run", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip() == f"runwatch train: --rank-port-base: port {port} is already in use on this machine"


def read_until(proc: subprocess.Popen, done: str, seen: list[str]) -> None:
    """Read the launcher's output into `seen`, up to the next line containing `done`."""
    while True:
        line = proc.stdout.readline()
        assert line, "".join(seen) + proc.stderr.read()
        seen.append(line)
        if done in line:
            return


@pytest.mark.integration
def test_a_crash_restarts_the_job_from_its_checkpoint_and_counts_the_steps_lost(tmp_path):
    """Rank 1's GPU falls off the bus at step 72 of seed 2; mpiexec ends both ranks, and the
    launcher restarts them from the checkpoint of step 49: 22 steps lost. The restarted job ends
    where an uninterrupted one does, bit for bit."""
    cfg = TrainConfig(ranks=2, incident="rank_crash", seed=2, onset=50, steps=100, run_id="rk")
    assert (fault_of(cfg).step, fault_of(cfg).rank) == (72, 1)
    proc = subprocess.Popen(
        [*LIVE, "--run-dir", str(tmp_path / "run"), "--ranks", "2", "--incident", "rank_crash",
         "--seed", "2", "--onset", "50", "--steps", "100", "--step-seconds", "0.02", "--restart-seconds", "0.5",
         "--hold", "30"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[str] = []
    try:
        read_until(proc, "run rk: completed", seen)
        launcher = re.search(r"run rk launcher: serving (\S+)", "".join(seen))[1]
        job = scrape(launcher)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    out = "".join(seen)
    assert "rank 1: Xid 79: GPU has fallen off the bus" in out
    # mpiexec's exit status is its own: 1 here, another under load
    stopped = (
        r"run rk: the job stopped after step 71 \(a rank failed, exit status \d+\); restarting from the checkpoint"
    )
    assert re.search(stopped + r" of step 49 in 0.5 s, 22 steps lost", out), out
    assert (job["runwatch_job_restarts_total"], job["runwatch_job_lost_steps_total"]) == (1, 22)
    assert 0 < job["runwatch_job_ettr"] < 1
    saved = np.load(tmp_path / "run" / "checkpoints" / "checkpoint-000099.npz")
    offline = Trainer(cfg)
    offline.run()
    assert np.array_equal(saved["w"], offline.w) and np.array_equal(saved["b"], offline.b)


@pytest.mark.slow  # a lab of its own for most of a minute: the slow tier keeps make test within 5 minutes
@pytest.mark.integration
def test_a_hang_pages_names_its_rank_and_the_watchdog_restarts_the_job(tmp_path):
    """Rank 1 of seed 2 hangs before step 72's exchange. A real Prometheus with cluster.yml scrapes
    both ranks and the launcher: TrainingStalled fires once no step has finished for 10 s, the
    flight recorder names rank 1, the ranks' 14 s watchdog ends the job, and JobRestarted fires
    with the 22 steps lost."""
    cfg = TrainConfig(ranks=2, incident="hang", seed=2, onset=50, steps=100, run_id="rk")
    assert (fault_of(cfg).step, fault_of(cfg).rank) == (72, 1)
    proc = subprocess.Popen(
        [*LIVE, "--run-dir", str(tmp_path / "run"), "--ranks", "2", "--incident", "hang", "--seed", "2",
         "--onset", "50", "--steps", "100", "--step-seconds", "0.1", "--watchdog-seconds", "14",
         "--restart-seconds", "1", "--hold", "30"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[str] = []
    try:
        targets: dict[int, str] = {}
        while len(targets) < 2:
            read_until(proc, "serving", seen)
            m = re.match(r"run rk rank (\d): serving http://([0-9.:]+)/metrics$", seen[-1])
            if m and int(m[1]) not in targets:  # a rank's own server is the first it names
                targets[int(m[1])] = m[2]
        launcher = re.search(r"run rk launcher: serving http://([0-9.:]+)/metrics", "".join(seen))[1]
        groups = [
            {"targets": [t], "labels": {"run_id": "rk", "rank": str(r), "node": "node0"}} for r, t in targets.items()
        ]
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{REPO / 'prometheus' / 'rules' / 'cluster.yml'}]\n"
            f"scrape_configs: [{{job_name: ranks, honor_labels: true, static_configs: {json.dumps(groups)}}},"
            f" {{job_name: launcher, static_configs: [{{targets: ['{launcher}']}}]}}]\n"
        )
        argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
        base = f"http://127.0.0.1:{port}"
        with Process(argv, f"{base}/-/ready", tmp_path / "prometheus.log"):
            # the hang at 7.2 s of steps, then 10 s without a step and an evaluation
            [stalled] = wait_for(lambda: names_firing(port, {"TrainingStalled"}), 60, "TrainingStalled")[
                "TrainingStalled"
            ]
            assert stalled["run_id"] == "rk" and "JobRestarted" not in names_firing(port, set())
            recorder = runwatch("flight-recorder", "--run", "rk", "--prometheus", base, "--state-dir", str(tmp_path),
                                cwd=tmp_path)  # fmt: skip
            # the watchdog: 14 s after the ranks entered the exchange
            wait_for(lambda: names_firing(port, {"JobRestarted"}), 60, "JobRestarted")
            [lost] = instant(base, 'runwatch_job_lost_steps_total{run_id="rk"}')
            read_until(proc, "run rk: completed", seen)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert recorder.returncode == 0, recorder.stderr
    assert "rank 1 on node0 has not entered collective 73 (its last is 72): ranks 0 are waiting for it there" in (
        recorder.stdout
    )
    assert float(lost["value"][1]) == 22
    out = "".join(seen)
    assert "rank 1: hung before collective 73" in out and "watchdog: collective 73 did not complete in 14 s" in out
    saved = np.load(tmp_path / "run" / "checkpoints" / "checkpoint-000099.npz")
    offline = Trainer(cfg)
    offline.run()
    assert np.array_equal(saved["w"], offline.w) and np.array_equal(saved["b"], offline.b)


def test_the_launcher_writes_prometheus_s_targets_for_compose(tmp_path):
    """compose's trainer writes its ranks' and launcher's targets into the volume Prometheus
    reads; a run of one process writes empty ones, so that no earlier cluster lingers there."""
    args = argparse.Namespace(
        targets_dir=tmp_path / "t", targets_host="trainer", rank_port_base=8100, launcher_port=8099
    )
    write_targets(args, TrainConfig(ranks=4, run_id="rk"))
    ranks = json.loads((tmp_path / "t" / "ranks.json").read_text())
    assert ranks[3] == {"targets": ["trainer:8103"], "labels": {"run_id": "rk", "rank": "3", "node": "node1"}}
    assert json.loads((tmp_path / "t" / "launcher.json").read_text()) == [{"targets": ["trainer:8099"]}]
    write_targets(args, TrainConfig(run_id="one"))
    assert [json.loads((tmp_path / "t" / f).read_text()) for f in ("ranks.json", "launcher.json")] == [[], []]
    with pytest.raises(UsageError, match="^--targets-dir: the targets need fixed ports"):
        write_targets(argparse.Namespace(**{**vars(args), "rank_port_base": 0}), TrainConfig(ranks=2, run_id="rk"))


@pytest.mark.integration
@pytest.mark.slow  # two MPI ranks polling for a minute: both cores, beside the suite's labs
def test_watched_ranks_hold_together_while_prometheus_is_away_and_a_hang_still_hangs(tmp_path):
    """Two ranks whose clock waits for Prometheus (as the lab runs them). Prometheus stopped
    (SIGSTOP) for longer than the ranks' watchdog: every rank holds at the same step, outside
    any exchange, so no watchdog fires; scraped again, they go on together. Rank 1 of seed 2
    then hangs before step 72's exchange as it does unwatched: the watchdog ends the job and the
    launcher restarts it, whose ranks wait for Prometheus's scrapes again and complete the run."""
    assert (fault_of(TrainConfig(ranks=2, incident="hang", seed=2, onset=50)).step, 1) == (72, 1)
    job, launcher, base = free_port(), free_port(), free_ports_in_a_row(2)
    watchdog_s = 6  # the ranks' --watchdog-seconds: a rank outside an exchange this long ends the job
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "train", "--port", str(job), "--rank-port-base", str(base),
         "--launcher-port", str(launcher), "--run-id", "rk", "--run-dir", str(tmp_path / "run"), "--ranks", "2",
         "--incident", "hang", "--seed", "2", "--onset", "50", "--steps", "100", "--step-seconds", "0.1",
         "--watchdog-seconds", str(watchdog_s), "--restart-seconds", "1", "--hold", "30", "--wait-for-prometheus"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[str] = []
    records = [tmp_path / "run" / "run.json", tmp_path / "run" / "rank-1.json"]
    port = free_port()
    jobs = {"ranks": [f"127.0.0.1:{base + r}" for r in (0, 1)], "trainer": [f"127.0.0.1:{job}"]}
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": n, "static_configs": [{"targets": t}]} for n, t in jobs.items()],
    }))  # fmt: skip
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    try:
        with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log") as prom:
            read_until(proc, "step   10 |", seen)  # rank 0's log: the ranks train, watched
            prom.proc.send_signal(signal.SIGSTOP)
            try:
                # Held within the grace after the last scrape (1 s before the stop at most), once
                # the step under way ends: a step outlasting the watchdog's 6 s would end the job.
                bound = WATCH_GRACE_S + 1 + watchdog_s
                try:
                    wait_for(lambda: all(json.loads(r.read_text()).get("paused_since") for r in records), bound,
                             "both to hold")  # fmt: skip
                except pytest.fail.Exception:
                    proc.terminate()
                    out, err = proc.communicate(timeout=60)
                    states = [json.loads(r.read_text()) for r in records]
                    pytest.fail(f"the ranks did not both hold within {bound} s: {states}\n{''.join(seen)}{out}{err}")
                held = [json.loads(r.read_text())["last_step"] for r in records]
                assert held[0] == held[1] and held[0] < 72, held  # together, before the hang's step
                # past the watchdog's time: a held rank is in no exchange, and none moves on
                holds(lambda: [json.loads(r.read_text())["last_step"] for r in records] == held, watchdog_s + 2,
                      "both ranks held at one step")  # fmt: skip
            finally:
                prom.proc.send_signal(signal.SIGCONT)
            read_until(proc, "run rk: completed", seen)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    out = "".join(seen)
    assert re.search(rf"paused after step {held[0]}: Prometheus has not scraped for \d+ s", out), out
    assert f"resumed after step {held[0]}" in out
    # The hang, as unwatched: the watchdog fires in the exchange of step 72, never while the ranks held.
    assert out.count("watchdog: collective") == 1 and "watchdog: collective 73 did not complete in 6 s" in out
    assert "restarting from the checkpoint of step 49" in out

"""The simulated fleet (runwatch.cluster.fleet) and cluster.yml over it at a cluster's 5 s scrape:
one Prometheus, and agents sharded by hashmod remote-writing to a receiver that evaluates the rules.

Timing bounds come from the configuration: the scrape interval, the rules' windows and `for:`,
the group's evaluation interval and the agents' batch_send_deadline."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import requests

from runwatch.cluster.fleet import Fleet, FleetConfig, FleetServer
from runwatch.cluster.fleet_lab import BATCH_SEND_DEADLINE_S, FleetLab
from runwatch.prom.checks import POLL_S, evaluation_problems
from runwatch.prom.server import Process, free_port, prometheus_argv
from tests.conftest import DISCOVERY_S, need, wait_for

SCRAPE_S, EVAL_S, STEP_S = 5.0, 1.0, 1.0  # the fleet's scrape, cluster.yml's group interval, a lab second
MEDIAN_WINDOW_S, MEDIAN_HISTORY_S = 30.0, 10.0  # rank:...:median30s: its window, the history it asks of a rank
STRAGGLER_FOR_S, RANKDOWN_FOR_S, THROTTLE_FOR_S = 5.0, 10.0, 10.0  # cluster.yml's for:
STALL_S, UP_WINDOW_S = 10.0, 15.0  # TrainingStalled: the newest step's age, and the window every target was up in
TEN_MINUTE_GROUP_S = 30.0  # runwatch-cluster-10m's interval


def served(fleet: Fleet, path: str) -> requests.Response:
    server = FleetServer(fleet, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return requests.get(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=10)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.integration
def test_a_node_serves_its_ranks_as_the_lab_names_them_and_promtool_accepts_it(tmp_path):
    fleet = Fleet(FleetConfig(ranks=16, run_id="f"))
    fleet.tick(time.time())
    text = served(fleet, "/node/1/metrics").text
    assert 'runwatch_rank_last_compute_seconds{run_id="f",rank="9",node="node1"}' in text
    assert 'DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-' in text and 'Hostname="node1"}' in text
    res = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    fleet.fault("rank_down", rank=9)
    fleet.fault("node_down", rank=0)
    assert 'rank="9"' not in served(fleet, "/node/1/metrics").text and 'rank="10"' in text
    assert served(fleet, "/node/0/metrics").status_code == 503


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, flag",
    [(["--ranks", "100"], "--ranks"), (["--ranks", "0"], "--ranks"), (["--port", "70000"], "--port"),
     (["--step-seconds", "0"], "--step-seconds")],
)  # fmt: skip
def test_bad_fleet_flags_are_one_line_errors(tmp_path, args, flag):
    res = subprocess.run([sys.executable, "-m", "runwatch.cluster.fleet", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr, res.stderr


# the labels each alert names its fault by: a rank by rank and node, a GPU by host and index
NAMED_BY = {"GPUThermalThrottle": ("Hostname", "gpu"), "GPUXidError": ("Hostname", "gpu"),
            "TrainingStalled": ("run_id",), "JobRestarted": ("run_id",)}  # fmt: skip


def named(lab: FleetLab) -> dict[str, list[tuple[str, ...]]]:
    """Each alert firing where the rules are evaluated, and what each of its alerts names."""
    firing = lab.firing()
    return {name: sorted(tuple(a.get(k, "") for k in NAMED_BY.get(name, ("rank", "node")))
                         for a in firing if a["alertname"] == name)
            for name in {a["alertname"] for a in firing}}  # fmt: skip


def on_node(node: str, slot: int) -> int:
    """The rank in `slot` of `node` (its GPU's index there)."""
    return int(node.removeprefix("node")) * 8 + slot


@pytest.mark.slow  # a fleet and two or three Prometheus servers for about two minutes
@pytest.mark.integration
@pytest.mark.parametrize("topology", ["single", "sharded"])
def test_every_fleet_fault_pages_naming_its_rank_gpu_node_or_run_at_a_5s_scrape(tmp_path, topology):
    """256 ranks as 32 node targets, scraped every 5 s, each fault on a node the second agent
    scrapes in the sharded topology. A straggler (1/0.7 of the step), a GPU throttled (so its
    rank straggles too), an XID error, a rank whose process ended and a node gone: StragglerRank,
    GPUThermalThrottle, GPUXidError and RankDown fire where the rules are evaluated, each naming
    its rank and node (a GPU by host and index), and nothing else fires. Then, healed, the job
    hangs and restarts: TrainingStalled and JobRestarted name the run."""
    with FleetLab(tmp_path, need("prometheus"), ranks=256, scrape_s=SCRAPE_S, eval_s=EVAL_S, topology=topology,
                  shards=2) as lab:  # fmt: skip
        nodes = [f"node{i}" for i in (3, 5, 7, 9, 11)] if topology == "single" else wait_for(
            lambda: lab.nodes_of_shard(1), 2 * DISCOVERY_S, "the second agent's targets")  # fmt: skip
        slow, hot, xid, gone = on_node(nodes[0], 3), on_node(nodes[1], 5), on_node(nodes[2], 2), on_node(nodes[3], 6)
        dark = int(nodes[4].removeprefix("node"))
        # every rank has its median: the rules have seen its history (a sample 10 s old at least)
        wait_for(lambda: count(lab, "rank:runwatch_rank_last_compute_seconds:median30s") == 256,
                 MEDIAN_HISTORY_S + 3 * SCRAPE_S + 30, "every rank's median")  # fmt: skip
        # and RankDown knows every rank, GPUThermalThrottle every GPU's clock: runwatch-cluster-10m
        # has recorded them once
        for recorded in ("rank:runwatch_rank_step:present10m", "gpu:dcgm_fi_dev_sm_clock:max10m"):
            wait_for(lambda r=recorded: count(lab, r) == 256, TEN_MINUTE_GROUP_S + SCRAPE_S, recorded)
        lab.fault("straggler", rank=slow, slowdown=1 / 0.7)
        lab.fault("throttle", rank=hot)
        lab.fault("xid", rank=xid)
        lab.fault("rank_down", rank=gone)
        lab.fault("node_down", rank=dark * 8)
        # the first slow or missing sample within a step and a scrape (and, sharded, a batch of
        # the agent's remote write); the median turns once more than half its window is slow
        seen = STEP_S + SCRAPE_S + BATCH_SEND_DEADLINE_S
        straggler = seen + MEDIAN_WINDOW_S / 2 + SCRAPE_S + STRAGGLER_FOR_S + 2 * EVAL_S
        bound = max(straggler, seen + max(RANKDOWN_FOR_S, THROTTLE_FOR_S) + 2 * EVAL_S)
        expected = {
            "StragglerRank": sorted([(str(slow), nodes[0]), (str(hot), nodes[1])]),
            "RankDown": sorted([(str(gone), nodes[3]), *((str(r), nodes[4]) for r in range(dark * 8, dark * 8 + 8))]),
            "GPUThermalThrottle": [(nodes[1], "5")],
            "GPUXidError": [(nodes[2], "2")],
        }

        seen_last: list[dict] = []
        wait_for(lambda: seen_last.append(named(lab)) or seen_last[-1] == expected, bound,
                 lambda: f"{expected} (last fired: {seen_last[-1] if seen_last else None})")  # fmt: skip

        # healed, every node is scraped again within a scrape; TrainingStalled asks that every
        # target was up for its last 15 s, and that the newest step be 10 s old (the rank's
        # own time of it, whenever scraped)
        lab.fault("heal")
        lab.fault("hang")
        lab.fault("restart")
        stalled = max(SCRAPE_S + BATCH_SEND_DEADLINE_S + UP_WINDOW_S, STALL_S) + 2 * EVAL_S
        wait_for(lambda: named(lab).get("TrainingStalled") == [("fleet",)], stalled, "TrainingStalled")
        assert named(lab).get("JobRestarted") == [("fleet",)]  # its counter's rise, seen sooner


def count(lab: FleetLab, expr: str) -> int:
    r = requests.get(f"{lab.rules_url}/api/v1/query", params={"query": f"count({expr})"}, timeout=10).json()
    return int(float(r["data"]["result"][0]["value"][1])) if r["data"]["result"] else 0


@pytest.mark.integration
def test_reload_s_check_waits_for_the_paced_groups_not_for_a_slow_one(tmp_path):
    """runwatch-cluster-10m evaluates every 30 s: `runwatch reload` judges a group slower than
    PACED_S on what it has done by the time the paced groups have each evaluated once, rather
    than wait for its first evaluation. Here the slow group's interval is an hour, so its first
    evaluation (at an offset Prometheus hashes within the hour) is almost surely not in the wait."""
    (tmp_path / "rules.yml").write_text(
        "groups:\n"
        "  - {name: fast, interval: 1s, rules: [{record: job:up:sum, expr: sum(up)}]}\n"
        "  - {name: slow, interval: 1h, rules: [{record: job:up:max, expr: max(up)}]}\n"
    )
    (tmp_path / "prometheus.yml").write_text(f"rule_files: [{tmp_path / 'rules.yml'}]\n")
    port = free_port()
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
        since = time.time()
        assert evaluation_problems(f"http://127.0.0.1:{port}", since, query_timeout=2) == []
        # its own bound: the fast group's interval, the query timeout and two polls; and a few HTTP reads
        assert time.time() - since < 1.0 + 2 + 2 * POLL_S + 5.0

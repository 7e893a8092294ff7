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
from tests.conftest import need, wait_for

SCRAPE_S, EVAL_S, STEP_S = 5.0, 1.0, 1.0  # the fleet's scrape, cluster.yml's group interval, a lab second
MEDIAN_WINDOW_S, MEDIAN_HISTORY_S = 30.0, 10.0  # rank:...:median30s: its window, the history it asks of a rank
STRAGGLER_FOR_S, RANKDOWN_FOR_S = 5.0, 10.0  # cluster.yml's for:
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


def firing(lab: FleetLab, name: str) -> list[tuple[str, str]]:
    return sorted((a["rank"], a["node"]) for a in lab.firing() if a["alertname"] == name)


@pytest.mark.slow  # a fleet and two or three Prometheus servers for about a minute
@pytest.mark.integration
@pytest.mark.parametrize("topology", ["single", "sharded"])
def test_a_straggler_and_a_rank_gone_page_naming_their_ranks_at_a_5s_scrape(tmp_path, topology):
    """256 ranks as 32 node targets, scraped every 5 s. A straggler (1/0.7 of the step) and a
    rank whose process ended, both on nodes the second agent scrapes in the sharded topology:
    StragglerRank and RankDown fire where the rules are evaluated, each naming its rank and node,
    and no other rank."""
    with FleetLab(tmp_path, need("prometheus"), ranks=256, scrape_s=SCRAPE_S, eval_s=EVAL_S, topology=topology,
                  shards=2) as lab:  # fmt: skip
        # Prometheus's discovery manager hands targets on at most every 5 s
        nodes = ["node3", "node5"] if topology == "single" else wait_for(lambda: lab.nodes_of_shard(1), 2 * 5.0,
                                                                         "the second agent's targets")  # fmt: skip
        slow, gone = int(nodes[0].removeprefix("node")) * 8 + 3, int(nodes[1].removeprefix("node")) * 8 + 6
        # every rank has its median: the rules have seen its history (a sample 10 s old at least)
        wait_for(lambda: count(lab, "rank:runwatch_rank_last_compute_seconds:median30s") == 256,
                 MEDIAN_HISTORY_S + 3 * SCRAPE_S + 30, "every rank's median")  # fmt: skip
        # and RankDown knows every rank: runwatch-cluster-10m has recorded it once
        wait_for(lambda: count(lab, "rank:runwatch_rank_step:present10m") == 256, TEN_MINUTE_GROUP_S + SCRAPE_S,
                 "the ranks of the last 10 minutes")  # fmt: skip
        lab.fault("straggler", rank=slow, slowdown=1 / 0.7)
        lab.fault("rank_down", rank=gone)
        # the first slow or missing sample within a step and a scrape (and, sharded, a batch of
        # the agent's remote write); the median turns once more than half its window is slow
        seen = STEP_S + SCRAPE_S + BATCH_SEND_DEADLINE_S
        straggler = seen + MEDIAN_WINDOW_S / 2 + SCRAPE_S + STRAGGLER_FOR_S + 2 * EVAL_S
        bound = max(straggler, seen + RANKDOWN_FOR_S + 2 * EVAL_S)
        wait_for(lambda: firing(lab, "StragglerRank") and firing(lab, "RankDown"), bound, "both alerts")
        assert firing(lab, "StragglerRank") == [(str(slow), f"node{slow // 8}")]
        assert firing(lab, "RankDown") == [(str(gone), f"node{gone // 8}")]
        assert {a["alertname"] for a in lab.firing()} <= {"StragglerRank", "RankDown"}, lab.firing()


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

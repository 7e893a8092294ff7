"""A simulated fleet (runwatch.cluster.fleet) under real Prometheus servers: one, or sharded.

Two topologies evaluate the same rule files:
- "single": one Prometheus scrapes every node and evaluates the rules;
- "sharded": `shards` Prometheus agents (`--agent`) each scrape the nodes whose address and path
  hash to them (hashmod, as the Prometheus Operator's `shards`), and remote-write to a receiver
  Prometheus (`--web.enable-remote-write-receiver`) that scrapes nothing and evaluates the rules
  over the union.
The alerts are read where the rules are evaluated (`rules_url`); Alertmanager is optional.

For the tests (small fleets) and benchmarks/bench_scale.py (up to 16,384 ranks). Not the lab:
no trainer, no console; the fleet decides nothing about alerts.

    >>> with FleetLab(tmp, ranks=256, scrape_s=5, topology="sharded", shards=2) as lab:
    ...     onset = lab.fault("straggler", rank=37)
    ...     requests.get(f"{lab.rules_url}/api/v1/alerts")
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import requests

from runwatch.core.names import LOOPBACK
from runwatch.core.paths import REPO
from runwatch.prom.server import Process, free_port, prometheus_argv

CLUSTER_RULES = REPO / "prometheus" / "rules" / "cluster.yml"
# An agent sends what it scraped within this of the scrape (Prometheus's default is 5 s).
BATCH_SEND_DEADLINE_S = 1.0
TOPOLOGIES = ("single", "sharded")


def scrape_jobs(targets: Path, shard: int | None = None, shards: int = 1) -> list[dict]:
    """The fleet's two jobs, nodes and launcher, from the fleet's file_sd files; an agent's keep
    only the targets whose address and path hash to its shard."""
    keep = []
    if shard is not None:
        keep = [
            {"source_labels": ["__address__", "__metrics_path__"], "modulus": shards, "target_label": "__tmp_shard",
             "action": "hashmod"},
            {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
        ]  # fmt: skip
    return [
        {"job_name": job, "honor_labels": True, "file_sd_configs": [{"files": [str(targets / f"{job}.json")]}],
         **({"relabel_configs": keep} if keep else {})}
        for job in ("nodes", "launcher")
    ]  # fmt: skip


def global_config(scrape_s: float, eval_s: float) -> dict:
    return {"scrape_interval": f"{scrape_s:g}s", "scrape_timeout": f"{scrape_s:g}s",
            "evaluation_interval": f"{eval_s:g}s"}  # fmt: skip


def alerting(alertmanager: str | None) -> dict:
    if alertmanager is None:
        return {}
    return {"alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.split("//")[-1]]}]}]}}


def single_config(targets: Path, scrape_s: float, eval_s: float, rules: list[Path], alertmanager: str | None) -> dict:
    """One Prometheus: scrapes every node, evaluates the rules."""
    return {"global": global_config(scrape_s, eval_s), "rule_files": [str(r) for r in rules],
            "scrape_configs": scrape_jobs(targets), **alerting(alertmanager)}  # fmt: skip


def agent_config(targets: Path, scrape_s: float, shard: int, shards: int, receiver: str) -> dict:
    """Agent `shard` of `shards`: scrapes its share of the nodes and remote-writes it all."""
    write = {"url": f"{receiver}/api/v1/write", "queue_config": {"batch_send_deadline": f"{BATCH_SEND_DEADLINE_S:g}s"}}
    return {"global": {k: v for k, v in global_config(scrape_s, scrape_s).items() if k != "evaluation_interval"},
            "scrape_configs": scrape_jobs(targets, shard, shards), "remote_write": [write]}  # fmt: skip


def receiver_config(eval_s: float, rules: list[Path], alertmanager: str | None) -> dict:
    """The receiver: scrapes nothing, evaluates the rules over what the agents write."""
    return {"global": {"evaluation_interval": f"{eval_s:g}s"}, "rule_files": [str(r) for r in rules],
            **alerting(alertmanager)}  # fmt: skip


class FleetLab:
    """The fleet and its Prometheus servers, in `state` (a folder of its own), stopped on exit."""

    def __init__(self, state: Path, prometheus: str, ranks: int = 256, scrape_s: float = 5.0, eval_s: float = 1.0,
                 topology: str = "single", shards: int = 2, rules: list[Path] | None = None,
                 alertmanager: str | None = None, step_seconds: float = 1.0):  # fmt: skip
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
        self.state, self.prometheus, self.ranks = Path(state), prometheus, ranks
        self.scrape_s, self.eval_s, self.topology, self.shards = scrape_s, eval_s, topology, shards
        self.rules, self.alertmanager, self.step_seconds = rules or [CLUSTER_RULES], alertmanager, step_seconds
        self.stack = ExitStack()
        self.servers: dict[str, Process] = {}  # by name: fleet, prometheus, receiver, agent-0, ...

    def __enter__(self) -> FleetLab:
        self.state.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _serve(self, name: str, argv: list[str], url: str) -> str:
        proc = Process(argv, f"{url}/-/ready", self.state / f"{name}.log", timeout=60)
        self.servers[name] = self.stack.enter_context(proc)
        return url

    def _start(self) -> None:
        targets = self.state / "targets"
        port = free_port()
        self.fleet_url = self._serve("fleet", [sys.executable, "-m", "runwatch.cluster.fleet", "--ranks",
                                               str(self.ranks), "--port", str(port), "--targets-dir", str(targets),
                                               "--step-seconds", str(self.step_seconds)],
                                     f"http://{LOOPBACK}:{port}")  # fmt: skip
        if self.topology == "single":
            self.rules_url = self._prometheus("prometheus", single_config(
                targets, self.scrape_s, self.eval_s, self.rules, self.alertmanager))  # fmt: skip
            return
        self.rules_url = self._prometheus("receiver", receiver_config(self.eval_s, self.rules, self.alertmanager),
                                          "--web.enable-remote-write-receiver")  # fmt: skip
        self.agent_urls = []
        for shard in range(self.shards):
            config = agent_config(targets, self.scrape_s, shard, self.shards, self.rules_url)
            path = self.state / f"agent-{shard}.yml"
            path.write_text(json.dumps(config, indent=1) + "\n")
            port = free_port()
            argv = [self.prometheus, "--agent", f"--config.file={path}",
                    f"--storage.agent.path={self.state / f'agent-{shard}-data'}",
                    f"--web.listen-address={LOOPBACK}:{port}"]  # fmt: skip
            self.agent_urls.append(self._serve(f"agent-{shard}", argv, f"http://{LOOPBACK}:{port}"))

    def _prometheus(self, name: str, config: dict, *flags: str) -> str:
        path = self.state / f"{name}.yml"
        path.write_text(json.dumps(config, indent=1) + "\n")
        port = free_port()
        argv = prometheus_argv(self.prometheus, path, self.state / f"{name}-data", port, *flags)
        return self._serve(name, argv, f"http://{LOOPBACK}:{port}")

    def fault(self, kind: str, rank: int = 0, **params: float) -> float:
        """Inject a fault now; its onset as the fleet recorded it (Unix time)."""
        query = {"kind": kind, "rank": rank, **params}
        # the onset is the fleet's own clock, so a slow answer (a busy machine) does not skew it;
        # a connection refused or reset by a fleet whose queue is full never reached it: once more
        try:
            resp = requests.post(f"{self.fleet_url}/fault", params=query, timeout=60)
        except requests.ConnectionError:
            time.sleep(1)
            resp = requests.post(f"{self.fleet_url}/fault", params=query, timeout=60)
        resp.raise_for_status()
        return float(resp.json()["onset"])

    def nodes_of_shard(self, shard: int) -> list[str]:
        """The nodes agent `shard` scrapes, as it reports its active targets (its own hashmod)."""
        data = requests.get(f"{self.agent_urls[shard]}/api/v1/targets", timeout=10).json()["data"]
        return sorted(t["labels"]["node"] for t in data["activeTargets"] if "node" in t["labels"])

    def firing(self) -> list[dict]:
        """The labels of each alert firing where the rules are evaluated."""
        alerts = requests.get(f"{self.rules_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return [a["labels"] for a in alerts if a["state"] == "firing"]

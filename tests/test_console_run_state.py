"""Whether the console reads a native run as running or stopped (console/sources.py, run_info):
Prometheus's last scrape of the run, and the trainer's own run.json. Here a real Prometheus
scrapes a real trainer exporter of one run, which then stops answering."""

from __future__ import annotations

import json
import os
import time

import pytest
from prometheus_client import CollectorRegistry

from runwatch.console.sources import LIVE_WITHIN_S, Sources
from runwatch.exporter.metrics import TrainerMetrics
from runwatch.exporter.server import start
from runwatch.prom.server import Process, free_port, instant, prometheus_argv
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.offline import simulate
from tests.conftest import need, wait_for

pytestmark = pytest.mark.integration  # a real Prometheus


def test_a_run_prometheus_lost_reads_stopped_only_once_its_trainer_stops_writing_its_record(tmp_path):
    """CI's slow tier saw a live lab's run read "stopped at step 275", its first live step,
    while its trainer ran on: in the second after a run's first scrape the query for its last
    scrape has no answer yet (its 1 s subquery steps fall before it), and under load scrapes come
    late. Natively the trainer's fresh record (rewritten at every step) says it runs; a record
    left as it was (a trainer killed -9) turns it to stopped once it is LIVE_WITHIN_S old."""
    metrics = TrainerMetrics("r", 0, "none", registry=CollectorRegistry())
    metrics.observe(simulate(TrainConfig(steps=2, onset=1, run_id="r")).records[1], tokens_per_second=65536.0)
    server = start(metrics.registry, 0)
    record = tmp_path / "state" / "runs" / "r" / "run.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"status": "running", "last_step": 1}))
    port, target = free_port(), f"127.0.0.1:{server.server_address[1]}"
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: trainer, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    base = f"http://127.0.0.1:{port}"
    sources = Sources(base, "http://127.0.0.1:1", "http://127.0.0.1:1", state_dir=tmp_path / "state")
    try:
        with Process(prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port),
                     f"{base}/-/ready", tmp_path / "prometheus.log"):  # fmt: skip
            wait_for(lambda: instant(base, 'runwatch_train_step{run_id="r"}'), 30, "the run, scraped")
            os.utime(record)  # as its trainer rewrites it at every step
            assert sources.run_info("r")["stopped"] is False
            server.shutdown()
            server.server_close()  # Prometheus's scrapes now fail
            wait_for(lambda: (sources.run_info("r")["unseen"] or 0) > LIVE_WITHIN_S, LIVE_WITHIN_S + 10, "lost")
            os.utime(record)  # the trainer's write of its next step
            assert sources.run_info("r")["stopped"] is False
            past = time.time() - LIVE_WITHIN_S - 1
            os.utime(record, (past, past))  # no write since: the trainer is gone
            info = sources.run_info("r")
            assert info["stopped"] is True and info["step"] == 1
    finally:
        server.server_close()

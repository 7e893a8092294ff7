"""A run id is data, never PromQL (issue 28, item 11): one with `"` in it went into the console's
queries unescaped, so a crafted run id (in a URL a page links the learner to) ran a query of its
own. Here a real Prometheus scrapes a real trainer exporter of one run, `victim`."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from runwatch.console.sources import Sources
from runwatch.exporter.metrics import TrainerMetrics
from runwatch.exporter.server import start
from runwatch.prom.server import Process, free_port, instant, prometheus_argv, quoted
from runwatch.readouts import dashboard_queries as dq
from tests.conftest import need, wait_for

pytestmark = pytest.mark.integration  # a real Prometheus

INJECTED = 'x"}[1s]) or vector(42) or last_over_time(up{a="'


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("injection")
    metrics = TrainerMetrics("victim", 0, "none", registry=CollectorRegistry())
    server = start(metrics.registry, 0)
    port, target = free_port(), f"127.0.0.1:{server.server_address[1]}"
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: trainer, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with Process(prometheus_argv(need("prometheus"), tmp / "prometheus.yml", tmp / "data", port),
                     f"{base}/-/ready", tmp / "prometheus.log"):  # fmt: skip
            wait_for(lambda: instant(base, 'runwatch_train_run_info{run_id="victim"}'), 30, "the victim's run")
            yield base
    finally:
        server.shutdown()


def test_a_run_id_cannot_add_a_query_of_its_own(prometheus):
    sources = Sources(prometheus, "http://127.0.0.1:1", "http://127.0.0.1:1")
    assert sources.run_info("victim")["started"] is not None  # the real run is read
    assert sources.run_info(INJECTED)["started"] is None  # not vector(42): a run that does not exist
    expr = dq.substitute('runwatch_train_step{run_id="$run"}', {"run": INJECTED}, range_s=60)
    assert instant(prometheus, expr) == []
    assert instant(prometheus, f'runwatch_train_run_info{{run_id="{quoted("vic" + "tim")}"}}')

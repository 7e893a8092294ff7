"""`runwatch query`: the runbooks' queries against a real Prometheus, which has no web UI here."""

from __future__ import annotations

import json

import pytest

from runwatch.exporter.metrics import TrainerMetrics
from runwatch.exporter.server import start
from runwatch.prom.server import Process, free_port, instant, prometheus_argv
from tests.conftest import need, runwatch, wait_for

pytestmark = pytest.mark.integration  # runwatch query, in a child, against a real Prometheus


@pytest.fixture
def prometheus(tmp_path):
    """A real Prometheus scraping a real exporter every second, on free ports."""
    metrics = TrainerMetrics("q-run", 7, "none")
    server = start(metrics.registry, 0)
    port = free_port()
    target = f"127.0.0.1:{server.server_address[1]}"
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: trainer, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    base = f"http://127.0.0.1:{port}"
    with Process(argv, f"{base}/-/ready", tmp_path / "prometheus.log"):
        # two scrapes at the 1 s interval: a range query of 5 s has samples
        wait_for(lambda: len(instant(base, 'count_over_time(up{job="trainer"}[10s])') or []) and
                 float(instant(base, 'count_over_time(up{job="trainer"}[10s])')[0]["value"][1]) >= 2, 30,
                 "two scrapes")  # fmt: skip
        yield base
    server.shutdown()


def test_an_instant_query_prints_each_series_and_its_value(prometheus, tmp_path):
    res = runwatch("query", 'runwatch_train_run_info{run_id="q-run"}', "--prometheus", prometheus, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.splitlines()
    assert line.startswith('runwatch_train_run_info{incident="none", instance="127.0.0.1:') and line.endswith("  1")
    assert 'run_id="q-run", seed="7"}' in line


def test_a_range_query_prints_the_samples_by_how_long_ago(prometheus, tmp_path):
    res = runwatch("query", "--range", "5s", "--step", "1s", 'up{job="trainer"}', "--prometheus", prometheus,
                   cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    head, *samples = res.stdout.splitlines()
    assert head.startswith('up{instance="127.0.0.1:') and head.endswith('job="trainer"}')
    assert samples and all(s.split()[1] == "1" and s.split()[0].startswith(("-", "now")) for s in samples), samples


@pytest.mark.parametrize(
    "args, where",
    [
        (["up{"], "expr: "),  # Prometheus's own parse error, in one line
        (["--range", "0s", "up"], "--range: expected a duration"),
        (["--range", "10h", "--step", "1s", "up"], "--step: 36000 samples a series"),
    ],
)
def test_bad_input_is_one_line_naming_what_to_fix(prometheus, tmp_path, args, where):
    res = runwatch("query", *args, "--prometheus", prometheus, cwd=tmp_path)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("runwatch query: ") and where in line, line


def test_a_prometheus_that_does_not_answer_is_one_line(tmp_path):
    res = runwatch("query", "up", "--prometheus", f"http://127.0.0.1:{free_port()}", cwd=tmp_path)
    assert res.returncode == 2 and "did not answer (ConnectionError)" in res.stderr


def test_the_lab_of_a_state_dir_is_the_default(prometheus, tmp_path):
    """Without --prometheus, the Prometheus the lab of --state-dir recorded in its lab.json."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"run_id": "q-run", "urls": {"prometheus": prometheus}}) + "\n")
    res = runwatch("query", 'runwatch_train_run_info{run_id="q-run"}', "--state-dir", str(state), cwd=tmp_path)
    assert res.returncode == 0 and 'run_id="q-run"' in res.stdout, res.stdout + res.stderr

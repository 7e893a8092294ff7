"""`runwatch flight-recorder` against a real Prometheus scraping real rank exporters."""

import pytest

from runwatch.exporter.rank_metrics import RANK_COLLECTIVE_SEQ, RankMetrics
from runwatch.exporter.server import start
from runwatch.prom.server import Process, free_port, instant, prometheus_argv
from tests.conftest import need, runwatch, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def four_ranks(tmp_path):
    """Four ranks' exporters, as trainer.rank serves them, scraped every second: the registries
    stay in this test's hands, to put any rank behind."""
    metrics = [RankMetrics("rk", r, f"node{r // 2}", str(r % 2), f"GPU-{r}") for r in range(4)]
    servers = [start(m.registry, 0) for m in metrics]
    port = free_port()
    targets = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: ranks, static_configs: [{{targets: {targets}}}]}}]\n"
    )
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
        yield metrics, f"http://127.0.0.1:{port}"
    for s in servers:
        s.shutdown()


def scraped(base: str, seqs: list[int]) -> bool:
    found = instant(base, 'runwatch_rank_collective_seq{run_id="rk"}')
    return sorted(int(float(s["value"][1])) for s in found) == sorted(seqs)


def test_it_names_the_rank_the_others_wait_for_and_none_once_they_are_level(four_ranks, tmp_path):
    metrics, base = four_ranks
    for r, m in enumerate(metrics):  # rank 1 never reached its 41st collective
        m.observe(step=39, compute=1.0, wait=0.0, step_seconds=1.0)
        m.entered(41 if r != 1 else 40)
    wait_for(lambda: scraped(base, [41, 40, 41, 41]), 30, "the ranks to be scraped")
    res = runwatch("flight-recorder", "--run", "rk", "--prometheus", base, "--state-dir", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "run rk: 4 ranks" in res.stdout
    assert "rank 1 on node0 has not entered collective 41 (its last is 40): ranks 0, 2, 3 are waiting for it there" in (
        res.stdout
    )
    assert res.stdout.count("has not entered") == 1
    # rank 1 catches up; the run is found by itself, the newest with ranks
    metrics[1].entered(41)
    wait_for(lambda: scraped(base, [41, 41, 41, 41]), 30, "rank 1's catching up to be scraped")
    res = runwatch("flight-recorder", "--prometheus", base, "--state-dir", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "run rk: 4 ranks" in res.stdout and "all 4 ranks have entered collective 41: none lags" in res.stdout


def test_errors_name_the_flag(four_ranks, tmp_path):
    _, base = four_ranks
    res = runwatch(
        "flight-recorder", "--run", "nosuch", "--prometheus", base, "--state-dir", str(tmp_path), cwd=tmp_path
    )
    assert res.returncode == 2 and res.stderr.strip().startswith("runwatch flight-recorder: --run: run nosuch")
    (tmp_path / "lab.json").write_text("{half")  # the lab's record, damaged
    res = runwatch("flight-recorder", "--prometheus", base, "--state-dir", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "lab.json" in res.stderr
    closed = f"http://127.0.0.1:{free_port()}"
    res = runwatch("flight-recorder", "--run", "rk", "--prometheus", closed, "--state-dir", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "--prometheus" in res.stderr


class Odd:
    """A hand-run exporter's rank series: one without a rank, one with a NaN sequence number,
    and no step or last-step series at all (anything can be scraped or pushed)."""

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        seq = GaugeMetricFamily(RANK_COLLECTIVE_SEQ, "seq", labels=["run_id", "rank"])
        seq.add_metric(["odd", ""], 3)  # an empty label is no label: a series without a rank
        seq.add_metric(["odd", "1"], float("nan"))
        seq.add_metric(["odd", "0"], 5)
        yield seq


def test_series_without_rank_nan_or_no_step_are_left_out_not_a_traceback(tmp_path):
    """Issue 28, item 8: flight-recorder on series without `rank`, a NaN sequence number or no
    step series ended in a traceback."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(Odd())
    server = start(registry, 0)
    port, target = free_port(), f"127.0.0.1:{server.server_address[1]}"
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: odd, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    base = f"http://127.0.0.1:{port}"
    try:
        with Process(argv, f"{base}/-/ready", tmp_path / "prometheus.log"):
            wait_for(lambda: len(instant(base, f'{RANK_COLLECTIVE_SEQ}{{run_id="odd"}}')) == 3, 30, "the odd series")
            res = runwatch("flight-recorder", "--run", "odd", "--prometheus", base, "--state-dir", str(tmp_path),
                           cwd=tmp_path)  # fmt: skip
    finally:
        server.shutdown()
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "run odd: 1 ranks" in res.stdout and "never scraped" in res.stdout, res.stdout

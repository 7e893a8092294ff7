"""`runwatch flight-recorder` against a real Prometheus scraping real rank exporters."""

import pytest

from runwatch.exporter.rank_metrics import RankMetrics
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

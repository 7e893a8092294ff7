"""Write two_runs.test.yml: every series the lab's exporters serve, for two runs at once.

    python prometheus/tests/make_two_runs_test.py      # rewrites prometheus/tests/two_runs.test.yml

A rule can evaluate cleanly while the lab has one run and fail once a second one exists: a match
on `job` or `instance` where it should be on `run_id`, an info series joined without `by`, any
`group_left` whose right side is no longer one series. Live, with one run, Prometheus reports
nothing wrong, and the other test files hold only the series their alerts read. Here the lab's
own exporters (the trainer's, two ranks' and the launcher's registries, scraped with the text
format Prometheus reads) serve two healthy runs side by side for 60 s, and promtool evaluates
every rule of every rule file over them at each second. A rule that fails to evaluate fails
this file, so `runwatch check` and `runwatch reload` refuse it; and no alert may fire, as none
does for two healthy runs in the lab. Times in the series (a start, a last step) are laid on
promtool's clock, which starts at 0; nothing here evaluates a rule.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from runwatch.exporter.metrics import TrainerMetrics  # noqa: E402
from runwatch.exporter.rank_metrics import LauncherMetrics, RankMetrics  # noqa: E402
from runwatch.trainer.config import TrainConfig  # noqa: E402
from runwatch.trainer.gpu import gpu_index, gpu_state, gpu_uuid  # noqa: E402
from runwatch.trainer.offline import simulate  # noqa: E402
from runwatch.trainer.run import compute_seconds  # noqa: E402

OUT = Path(__file__).with_name("two_runs.test.yml")
SEED, FIRST, SECONDS = 1000, 230, 60  # steps FIRST.. of each run, one a second from 0 s
RANKS = 2
RULE_FILES = sorted(p.name for p in (Path(__file__).parents[1] / "rules").glob("*.yml"))
LAB_TARGETS = {"prometheus": 9090, "alertmanager": 9093, "pager": 9095}  # prometheus.yml's other jobs
UNIX_TIME = 1e9  # a sample this large is a time (a start, a last step): laid on promtool's clock


def _scrape(registry, labels: dict[str, str], at: int, into: dict[str, list[float]]) -> None:
    """One scrape of a registry at second `at` of the grid, as Prometheus stores it."""
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(at) if sample.value > UNIX_TIME else sample.value
            pairs = {**sample.labels, **labels}
            key = sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items())) + "}"
            into.setdefault(key, []).append(value)


def _run(run_id: str, index: int, into: dict[str, list[float]]) -> None:
    """A healthy run of RANKS ranks, as `runwatch up --ranks` serves it: the job's trainer
    exporter, one exporter per rank, and the launcher's. Its nodes are its own."""
    cfg = TrainConfig(seed=SEED + index, ranks=RANKS, run_id=run_id)
    records = simulate(TrainConfig(seed=SEED + index, run_id=run_id)).records[FIRST : FIRST + SECONDS]
    seconds = compute_seconds(cfg)
    trainer = TrainerMetrics(run_id, cfg.seed, cfg.incident, clock=lambda: UNIX_TIME * 2)
    ranks = [RankMetrics(run_id, r, f"node{index * RANKS + r}", str(gpu_index(cfg, r)), gpu_uuid(cfg, r))
             for r in range(RANKS)]  # fmt: skip
    launcher = LauncherMetrics(run_id, ettr=lambda: 0.97)
    for at, rec in enumerate(records):
        trainer.observe(rec, rec.tokens / rec.duration_seconds, wall_seconds=rec.duration_seconds)
        for r, metrics in enumerate(ranks):
            compute = float(seconds[r, rec.step])
            metrics.observe(rec.step, compute, wait=0.01, step_seconds=compute + 0.01)
            gpu = gpu_state(cfg, r, rec.step)
            metrics.observe_gpu(gpu.temp_c, gpu.sm_clock_mhz, gpu.power_w, gpu.fb_used_mib, gpu.xid)
        port = 8000 + 10 * index
        targets = [(trainer.registry, {"job": "trainer", "instance": f"127.0.0.1:{port}"})]
        targets += [(m.registry, {"job": "ranks", "instance": f"127.0.0.1:{port + 1 + r}"})
                    for r, m in enumerate(ranks)]  # fmt: skip
        targets += [(launcher.registry, {"job": "launcher", "instance": f"127.0.0.1:{port + 9}"})]
        for registry, labels in targets:
            _scrape(registry, labels, at, into)
            key = f'up{{instance="{labels["instance"]}",job="{labels["job"]}"}}'
            into.setdefault(key, []).append(1.0)


def render() -> str:
    series: dict[str, list[float]] = {}
    for index, run_id in enumerate(("first-1000", "second-1001")):
        _run(run_id, index, series)
    for job, port in LAB_TARGETS.items():  # the lab's own services, up throughout
        series[f'up{{instance="127.0.0.1:{port}",job="{job}"}}'] = [1.0] * SECONDS
    group = {
        "name": "two healthy runs side by side, every series the exporters serve",
        "interval": "1s",
        "input_series": [
            {"series": key, "values": " ".join(f"{v:.6g}" for v in values)} for key, values in sorted(series.items())
        ],
        "promql_expr_test": [
            {
                "expr": "count by (run_id) (runwatch_train_step)",
                "eval_time": f"{SECONDS - 1}s",
                "exp_samples": [
                    {"labels": '{run_id="first-1000"}', "value": 1},
                    {"labels": '{run_id="second-1001"}', "value": 1},
                ],
            },
            {
                "expr": f'count_over_time(ALERTS{{alertstate="firing",alertname!="Watchdog"}}[{SECONDS}s])',
                "eval_time": f"{SECONDS - 1}s",
                "exp_samples": [],
            },
        ],  # fmt: skip
    }
    doc = {
        "rule_files": [f"../rules/{name}" for name in RULE_FILES],
        "evaluation_interval": "1s",
        "tests": [group],
    }
    header = (
        "# Generated by make_two_runs_test.py from the lab's own exporters; do not edit.\n"
        "# Two healthy runs side by side: every rule must evaluate over them, and none fire.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=200)


def main() -> None:
    OUT.write_text(render())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

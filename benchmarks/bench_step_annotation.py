"""What RankDown's `step` annotation costs when a whole job's ranks vanish at once, by promtool.

Prometheus expands the annotations of every pending or firing alert at every evaluation, and
each cluster alert's `step` runs a PromQL query (the `query` template function). This builds a
promtool test in which N ranks stop serving at 50 s, so RankDown is pending and then firing for
N ranks until 5 min. It runs the test twice, on cluster.yml's runwatch-cluster group with and
without RankDown's `step`, and prints promtool's CPU for each. The difference divided by the
alert evaluations is the cost of one annotation query.

    python benchmarks/bench_step_annotation.py --ranks 512
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from runwatch.cluster.fleet_lab import CLUSTER_RULES
from runwatch.prom.tools import binary

GONE_AT_S, UNTIL_S, EVAL_S = 50, 300, 5


def rules(drop_step: bool) -> dict:
    doc = yaml.safe_load(CLUSTER_RULES.read_text())
    [group] = [g for g in doc["groups"] if g["name"] == "runwatch-cluster"]
    for r in group["rules"]:
        if r.get("alert") == "RankDown" and drop_step:
            r["annotations"].pop("step")
    return {"groups": [group]}


def test(ranks: int, rule_file: str) -> dict:
    series = []
    for i in range(ranks):
        labels = f'run_id="x",rank="{i}",node="node{i // 8}"'
        series.append({"series": f"rank:runwatch_rank_step:present10m{{{labels}}}", "values": f"1x{UNTIL_S // EVAL_S}"})
        series.append({"series": f'runwatch_rank_step{{job="nodes",{labels}}}',
                       "values": f"1+1x{GONE_AT_S // EVAL_S - 1} stale"})  # fmt: skip
    case = {"interval": f"{EVAL_S}s", "input_series": series,
            "alert_rule_test": [{"eval_time": f"{UNTIL_S}s", "alertname": "RankDown", "exp_alerts": []}]}  # fmt: skip
    return {"rule_files": [rule_file], "evaluation_interval": f"{EVAL_S}s", "tests": [case]}


def cpu_of(argv: list[str], cwd: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=cwd, capture_output=True, timeout=3600)  # it fails: no alert is expected
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=512)
    args = p.parse_args()
    promtool = binary("promtool")
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        cpu = {}
        for name, drop in (("without step", True), ("with step", False)):
            (Path(tmp) / "rules.yml").write_text(yaml.safe_dump(rules(drop), sort_keys=False, width=400))
            (Path(tmp) / "test.yml").write_text(yaml.safe_dump(test(args.ranks, "rules.yml"), sort_keys=False))
            cpu[name] = cpu_of([promtool, "test", "rules", "test.yml"], Path(tmp))
            print(f"{args.ranks} ranks gone, RankDown {name}: promtool {cpu[name]:.1f} s CPU", flush=True)
    alert_evals = args.ranks * ((UNTIL_S - GONE_AT_S) // EVAL_S + 1)
    extra = cpu["with step"] - cpu["without step"]
    print(f"step annotation: {extra:.1f} s CPU over {alert_evals:,} alert evaluations, "
          f"{1000 * extra / alert_evals:.2f} ms each")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

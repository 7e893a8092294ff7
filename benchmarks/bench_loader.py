"""The backtest's two ways of loading runs into a TSDB, in CPU seconds, side by side.

    python benchmarks/bench_loader.py [--seeds 100-199:2] [--repeats 3]

For the same trained runs (half of the backtest's 500 by default: what one of its two workers
loads), with the families the shipped rules read:

- OpenMetrics: trainer.offline.write_openmetrics writes the text, and
  `promtool tsdb create-blocks-from openmetrics` parses it into a block;
- remote write (what the backtest does): runwatch.backtest.remote_write encodes the samples, and a
  loading Prometheus takes them and writes its head out with a snapshot (its whole life counted:
  start, ingest, snapshot, stop).

CPU seconds of this process and of the children it waited for; each way starts from runs whose
per-run caches (the activation norms) are empty.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runwatch.backtest import data, signatures
from runwatch.backtest.plan import families_read
from runwatch.backtest.remote_write import push, write_request
from runwatch.backtest.rules import load_rules
from runwatch.core.paths import Layout
from runwatch.prom.tools import binary
from runwatch.trainer.batch import train_columns
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.offline import OfflineRun, series, write_openmetrics


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="100-199:2", help="FIRST-LAST:STEP (default 100-199:2, 250 runs)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    span, _, step = args.seeds.partition(":")
    first, _, last = span.partition("-")
    seeds = list(range(int(first), int(last) + 1, int(step or 1)))
    prometheus, promtool = binary("prometheus"), binary("promtool")
    families = families_read(load_rules(Layout().rules_dir, promtool))
    configs = [TrainConfig(incident=i, seed=s) for s in seeds for i in signatures.INCIDENTS]
    columns = train_columns(configs)

    def runs() -> list[OfflineRun]:  # fresh runs: nothing computed yet
        return [OfflineRun(c, _copy(col), shift_ms=data.GRID_PHASE_MS) for c, col in zip(configs, columns, strict=True)]

    text, pushed = [], []
    gc.disable()
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp_name:
            tmp = Path(tmp_name)
            batch = runs()
            t0, c0 = time.process_time(), children_cpu()
            with open(tmp / "runs.om", "w") as fh:
                samples = write_openmetrics(batch, fh, families)
            subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", tmp / "runs.om", tmp / "om"],
                           capture_output=True, check=True)  # fmt: skip
            text.append(time.process_time() - t0 + children_cpu() - c0)
            batch = runs()
            t0, c0 = time.process_time(), children_cpu()
            body, n = write_request(s for run in batch for s in series(run, families))
            loader = data.loading_server(prometheus, tmp)
            with loader.running():
                push(loader.base, body)
                data.snapshot(loader, tmp / "pushed")
            pushed.append(time.process_time() - t0 + children_cpu() - c0)
            assert n == samples
    print(f"{len(configs)} runs, {samples:,} samples, CPU seconds (median / best of {args.repeats})")
    print(f"OpenMetrics + promtool:       {statistics.median(text):5.2f} / {min(text):5.2f}")
    print(f"remote write + snapshot:      {statistics.median(pushed):5.2f} / {min(pushed):5.2f}")
    print(f"remote write: {statistics.median(pushed) / statistics.median(text):.0%} of the CPU time")
    return 0


def _copy(col):
    """The same columns in a new object, without the cached activation norms."""
    return type(col)(**{name: getattr(col, name) for name in col.__dataclass_fields__})


if __name__ == "__main__":
    sys.exit(main())

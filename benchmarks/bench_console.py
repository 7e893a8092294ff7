"""How fast does each view of the console answer, with 10 runs in Prometheus? Target: < 200 ms.

    python benchmarks/bench_console.py [--requests 30]

Ten runs (seeds 0-1 x the five incidents, 600 steps each, started ten minutes apart over the
last two hours) are trained offline and backfilled into a throwaway Prometheus, with the
recording rules of baselines.yml backfilled over them, as a lab would have recorded them. A
real pager holds 50 pages across the runs, and a real Alertmanager answers for acks. Then
`runwatch console` serves them all, and each view is fetched over HTTP, one request at a time
after three warm-ups: the latencies are what a learner's browser waits for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from runwatch.core.paths import REPO
from runwatch.lab.argv import ALERTMANAGER_FLAGS
from runwatch.lab.render import loopback
from runwatch.oncall.records import rfc3339_ms
from runwatch.prom.server import Process, free_port
from runwatch.prom.tools import alertmanager_launch, binary
from runwatch.trainer.config import INCIDENTS, TrainConfig
from runwatch.trainer.offline import simulate, write_openmetrics

TARGET_MS = 200


def load_runs(tmp: Path, now: float) -> tuple[list[str], float, float]:
    """Train ten runs and backfill them; return their ids (oldest first) and the time span."""
    runs = []
    for i, (seed, incident) in enumerate((s, inc) for s in (0, 1) for inc in INCIDENTS):
        cfg = TrainConfig(incident=incident, seed=seed, run_id=f"bench-{incident}-{seed}")
        runs.append(simulate(cfg, start=now - 7200 + 600 * i))
    with open(tmp / "runs.om", "w") as fh:
        write_openmetrics(runs, fh)
    promtool = binary("promtool")
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "runs.om"), str(tmp / "data")],
                   check=True, capture_output=True)  # fmt: skip
    end = max(r.step_time(len(r.records) - 1) for r in runs)
    return [r.cfg.run_id for r in runs], now - 7200, end


def prometheus(tmp: Path) -> Process:
    port = free_port()
    (tmp / "prometheus.yml").write_text("global: {}\n")
    argv = [binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
            "--storage.tsdb.retention.time=1y", f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    return Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp / "prometheus.log")


def backfill_baselines(tmp: Path, start: float, end: float) -> None:
    """The baselines' recording rules over the runs (the dashboard's threshold lines read them)."""
    (tmp / "baselines.yml").write_text((REPO / "prometheus" / "rules" / "baselines.yml").read_text())
    with prometheus(tmp) as prom:
        base = prom.ready_url.removesuffix("/-/ready")
        subprocess.run(
            [binary("promtool"), "tsdb", "create-blocks-from", "rules", f"--start={int(start)}",
             f"--end={int(end) + 2}", f"--url={base}", "--eval-interval=1s", f"--output-dir={tmp / 'data'}",
             "baselines.yml"],
            check=True, capture_output=True, cwd=tmp,
        )  # fmt: skip


def pages_log(tmp: Path, runs: list[str], now: float) -> Path:
    log = tmp / "pages.jsonl"
    alerts = ("TrainingLossJump", "GradientNormJump", "HeldOutGap", "ThroughputDrop", "TrainerDown")
    with open(log, "w") as fh:
        for i in range(50):
            run, alert = runs[i % len(runs)], alerts[i % len(alerts)]
            at = rfc3339_ms(now - 3600 + i)
            page = {"received_at": at, "alert": alert, "status": "firing", "run_id": run, "step": "300",
                    "severity": "page", "summary": f"{alert} in run {run}", "description": "a benchmark's page",
                    "runbook_url": f"http://127.0.0.1:9095/runbooks/{alert}.md",
                    "rule": {"expr": "x > 3", "for": "0s"}, "fingerprint": f"f{i}", "starts_at": at}  # fmt: skip
            fh.write(json.dumps(page) + "\n")
    return log


def timed(url: str, n: int) -> list[float]:
    session = requests.Session()
    for _ in range(3):
        session.get(url, timeout=30).raise_for_status()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        session.get(url, timeout=30).raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="timed requests per view (default 30)")
    args = parser.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp_name:
        tmp = Path(tmp_name)
        runs, start, end = load_runs(tmp, now)
        backfill_baselines(tmp, start, end)
        pager_port, am_port, console_port = free_port(), free_port(), free_port()
        (tmp / "am").mkdir()
        (tmp / "am" / "alertmanager.yml").write_text(loopback((REPO / "alertmanager" / "alertmanager.yml").read_text()))
        pager = Process([sys.executable, "-m", "runwatch", "pager-serve", "--port", str(pager_port),
                         "--log", str(pages_log(tmp, runs, now)), "--runbooks", str(REPO / "runbooks")],
                        f"http://127.0.0.1:{pager_port}/-/ready", tmp / "pager.log")  # fmt: skip
        am_bin = binary("alertmanager")
        am = Process([*alertmanager_launch(am_bin), am_bin, f"--config.file={tmp / 'am' / 'alertmanager.yml'}",
                      f"--storage.path={tmp / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}", *ALERTMANAGER_FLAGS],
                     f"http://127.0.0.1:{am_port}/-/ready", tmp / "am.log")  # fmt: skip
        with prometheus(tmp) as prom, pager, am:
            base = prom.ready_url.removesuffix("/-/ready")
            console = Process([sys.executable, "-m", "runwatch", "console", "--port", str(console_port),
                               "--prometheus", base, "--alertmanager", f"http://127.0.0.1:{am_port}",
                               "--pager", f"http://127.0.0.1:{pager_port}"],
                              f"http://127.0.0.1:{console_port}/-/ready", tmp / "console.log")  # fmt: skip
            with console:
                c = f"http://127.0.0.1:{console_port}"
                listed = requests.get(f"{c}/", timeout=30).text.count("<option value=")
                views = {
                    "/ (run picker, forms)": f"{c}/",
                    "/api/plate, newest run": f"{c}/api/plate?run={runs[-1]}",
                    "/api/plate, oldest run": f"{c}/api/plate?run={runs[0]}",
                    "/pages (5 of 50 pages)": f"{c}/pages?run={runs[-1]}",
                    "/runbook/HeldOutGap": f"{c}/runbook/HeldOutGap",
                    "/static/console.js": f"{c}/static/console.js",
                }
                print(f"{len(runs)} runs in Prometheus, {listed} in the run picker; {args.requests} requests per view")
                print(f"{'view':28s} {'median':>8s} {'p95':>8s} {'max':>8s}")
                worst = 0.0
                for name, url in views.items():
                    ms = sorted(timed(url, args.requests))
                    p95 = ms[max(0, round(0.95 * len(ms)) - 1)]
                    worst = max(worst, p95)
                    print(f"{name:28s} {statistics.median(ms):6.1f}ms {p95:6.1f}ms {ms[-1]:6.1f}ms")
    verdict = "meets" if worst < TARGET_MS else "MISSES"
    print(f"slowest p95 {worst:.1f} ms: {verdict} the {TARGET_MS} ms target")
    return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())

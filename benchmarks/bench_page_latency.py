"""Incident-to-page latency of the native lab: the trainer exporting the onset step -> the pager storing the page.

    python benchmarks/bench_page_latency.py [--runs 6]

Starts a lab (`runwatch up`, default ports, a temporary state directory), then runs corrupt_shard
trainers one after another, each fast-forwarded to step 270: 30 steps of history
before the onset, so that the running means the alerts compare with are not a few samples. For each it polls the
trainer's /metrics every 20 ms for the moment step 300 is exported, and reads from the page log
when the pager stored the TrainingLossJump and GradientNormJump pages.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

from runwatch.lab.supervise import Lab
from runwatch.oncall.page_log import read_pages
from runwatch.prom.server import wait_ready

ONSET = 300
ALERTS = ("TrainingLossJump", "GradientNormJump")


def exported_step(url: str) -> int:
    for line in requests.get(url, timeout=1).text.splitlines():
        if line.startswith("runwatch_train_step{"):
            return int(float(line.rsplit(" ", 1)[1]))
    return -1


def one_run(lab: Lab, i: int) -> list[float]:
    port, run_id = 8110 + i, f"latency-{i}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "train", "--port", str(port), "--run-id", run_id, "--seed", str(i),
         "--incident", "corrupt_shard", "--fast-forward", "270", "--run-dir", str(lab.runs / run_id)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        if not wait_ready(url, 60, proc):
            raise SystemExit(f"run {i}: the trainer on :{port} did not start")
        lab.write_target(f"trainer-{run_id}", [f"127.0.0.1:{port}"])
        while exported_step(url) < ONSET:
            time.sleep(0.02)
        exported = time.time()
        deadline = time.monotonic() + 60
        got: dict[str, float] = {}
        while len(got) < len(ALERTS) and time.monotonic() < deadline:
            for p in read_pages(lab.page_log):
                if p["run_id"] == run_id and p["status"] == "firing" and p["alert"] in ALERTS:
                    got[p["alert"]] = datetime.fromisoformat(p["received_at"].replace("Z", "+00:00")).timestamp()
            time.sleep(0.1)
        missing = [a for a in ALERTS if a not in got]
        if missing:  # say what Prometheus and Alertmanager held, so a lost page can be traced
            alerts = requests.get(f"{url('prometheus')}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
            held = [(a["labels"]["alertname"], a["state"]) for a in alerts if a["labels"].get("run_id") == run_id]
            am = requests.get(f"{url('alertmanager')}/api/v2/alerts", timeout=5, auth=lab.auth("alertmanager")).json()
            am_held = [
                (a["labels"]["alertname"], a["status"]["state"]) for a in am if a["labels"].get("run_id") == run_id
            ]
            print(f"run {i}: no page for {missing}; Prometheus holds {held}; Alertmanager holds {am_held}", flush=True)
        return [t - exported for t in got.values()]
    finally:
        lab.remove_target(f"trainer-{run_id}")
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--first", type=int, default=0, help="seed of the first run")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwind through the finally: stop the lab
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        up = [sys.executable, "-m", "runwatch", "up", "--state-dir", str(state), "--detach"]
        subprocess.run(up, check=True, stdout=subprocess.DEVNULL)
        lab = Lab(state)
        try:
            time.sleep(6)  # let Prometheus discover its targets
            latencies = []
            for i in range(args.first, args.first + args.runs):
                got = one_run(lab, i)
                latencies += got
                print(f"run {i}: " + ", ".join(f"{x:.2f}s" for x in got), flush=True)
        finally:
            lab.stop_all()
    print(f"incident-to-page latency over {len(latencies)} pages: median {statistics.median(latencies):.2f}s, "
          f"min {min(latencies):.2f}s, max {max(latencies):.2f}s")  # fmt: skip


if __name__ == "__main__":
    main()

"""Draw docs/plates/<incident>.png: one plate per incident, each from a real live run.

    python docs/plates/make_plates.py      # about 8 minutes: the runs are paced at one step a second

Starts a native lab in a temporary state directory, adds one trainer per incident (seed 7,
fast-forwarded to step 270) as targets of the trainer job, waits for every run to finish, then
draws each with `runwatch plate`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runwatch.lab.supervise import Lab
from runwatch.prom.server import wait_ready

HERE = Path(__file__).parent
INCIDENTS = ("none", "lr_spike", "corrupt_shard", "repeated_batch", "slow_node")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        subprocess.run([sys.executable, "-m", "runwatch", "up", "--state-dir", str(state), "--detach"], check=True)
        lab = Lab(state)
        procs = []
        try:
            for i, incident in enumerate(INCIDENTS):
                port, run_id = 8200 + i, f"plate-{incident}"
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "runwatch", "train", "--incident", incident, "--seed", "7",
                     "--fast-forward", "270", "--port", str(port), "--run-id", run_id,
                     "--run-dir", str(lab.runs / run_id)],
                    stdout=subprocess.DEVNULL,
                ))  # fmt: skip
                wait_ready(f"http://127.0.0.1:{port}/-/ready", 20)
                lab.write_target(f"trainer-{run_id}", [f"127.0.0.1:{port}"])
            for incident in INCIDENTS:
                record = lab.runs / f"plate-{incident}" / "run.json"
                while json.loads(record.read_text())["status"] == "running":
                    time.sleep(5)
            time.sleep(3)
            for incident in INCIDENTS:
                out = HERE / f"{incident}.png"
                subprocess.run(
                    [sys.executable, "-m", "runwatch", "plate", "--run", f"plate-{incident}", "--since", "15",
                     "--out", str(out)],
                    check=True,
                )  # fmt: skip
        finally:
            for p in procs:
                p.terminate()
            lab.stop_all()


if __name__ == "__main__":
    main()

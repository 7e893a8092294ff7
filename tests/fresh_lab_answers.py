"""Each component of a running native lab answers, from the PID files `runwatch up` wrote:
tests/fresh-machine.sh runs it (standard library only, on the host's Python, inside the lab's
network namespace) once `make lab` has printed its last start-up line.

    python3 tests/fresh_lab_answers.py CHECKOUT     # its lab's state in CHECKOUT/.runwatch; exit 0 if all answer
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

COMPONENTS = ("trainer", "prometheus", "alertmanager", "pager", "console")


def get(url: str, password: str | None = None) -> str:
    """A 2xx answer's body (anything else raises); with the lab's password as basic auth if given."""
    request = urllib.request.Request(url)
    if password is not None:  # Alertmanager's (runwatch.core.credentials: user runwatch)
        request.add_header("Authorization", "Basic " + base64.b64encode(f"runwatch:{password}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read().decode()


def scrape_interval_s(checkout: Path) -> float:
    """The lab Prometheus's global scrape interval, from the checkout's configuration (the state
    directory's copy is a symlink to it, by a path inside the fresh root)."""
    text = (checkout / "prometheus" / "prometheus.yml").read_text()
    m = re.search(r"scrape_interval:\s*(\d+)s", text)
    return float(m[1]) if m else 60.0


def main(checkout: Path) -> int:
    state = checkout / ".runwatch"
    records = {p.stem: json.loads(p.read_text()) for p in (state / "pids").glob("*.json")}
    missing = [c for c in COMPONENTS if c not in records]
    if missing:
        print(f"fresh lab: no PID file for {', '.join(missing)} in {state / 'pids'}")
        return 1
    password = (state / "alertmanager" / "password").read_text().strip()
    for name in COMPONENTS:
        get(records[name]["ready_url"], password if name == "alertmanager" else None)
        print(f"fresh lab: {name} answers at {records[name]['url']}")
    assert "pager" in get(records["alertmanager"]["url"].replace("/api/v2/alerts", "/api/v2/status"), password)
    # The trainer steps once Prometheus scrapes it (--wait-for-prometheus): within three scrape
    # intervals of the lab's start, its target is up and its loss is on /metrics.
    prom = records["prometheus"]["url"].removesuffix("/api/v1/targets")
    deadline = time.monotonic() + 3 * scrape_interval_s(checkout) + 10
    while True:
        targets = json.loads(get(f"{prom}/api/v1/targets"))["data"]["activeTargets"]
        trainer = [t for t in targets if t["scrapeUrl"] == records["trainer"]["url"]]
        stepping = "\nrunwatch_train_loss" in get(records["trainer"]["url"])
        if trainer and trainer[0]["health"] == "up" and stepping:
            print(f"fresh lab: Prometheus scrapes the trainer, which trains ({len(targets)} targets)")
            return 0
        if time.monotonic() > deadline:
            print(f"fresh lab: the trainer's target: {trainer or 'none'}; it trains (loss on /metrics): {stepping}")
            return 1
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

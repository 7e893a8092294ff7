"""Stopping a lab: a foreground `runwatch up` stops everything it started on SIGTERM, as on Ctrl-C.

Its own lab on the default ports (`no_lab`); this file sorts right after the drills, which
free those ports too, so the session's lab is not restarted for it.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import requests

from runwatch.lab import Lab
from tests.conftest import wait_for


def test_foreground_up_stops_every_component_on_sigterm(no_lab, tmp_path):
    """`kill` of a foreground `runwatch up` stops what it started, as Ctrl-C does: no orphans."""
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "up", "--state-dir", str(state)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def ready() -> bool:
        records = Lab(state).records()
        try:
            return len(records) == 4 and all(requests.get(r["ready_url"], timeout=1).ok for r in records.values())
        except requests.RequestException:
            return False

    try:
        wait_for(ready, 60, "the lab to be ready")
        records = Lab(state).records()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopping:" in out, out
    assert not any(Lab.alive(r) for r in records.values())
    assert Lab(state).records() == {}

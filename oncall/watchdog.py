"""The lab's dead-man's switch: Alertmanager posts the always-firing `Watchdog` alert to the
pager's /watchdog every few seconds. Once heard, a heartbeat that stops for `timeout` seconds
(Prometheus, Alertmanager or the route between them is down) becomes a page of the pager's own,
`WatchdogSilent`, and a resolution when the heartbeat returns.

One of the two alerts decided outside PromQL, on purpose (the other is `runwatch pager`'s
Unpaged): nothing else in the lab can page about the alerting pipeline itself, because that
pipeline is what carries pages. A pure state machine on an injected clock.

    >>> dog = Watchdog(30.0); dog.beat(0.0); dog.check(31.0)["alert"]
    'WatchdogSilent'
"""

from __future__ import annotations

import threading
from typing import Any

from runwatch.core.names import RUNBOOK_BASE
from runwatch.oncall.records import page_record, rfc3339_ms

WATCHDOG_SILENT = "WatchdogSilent"
# Alertmanager repeats the Watchdog every 10 s (alertmanager.yml); three missed beats page.
WATCHDOG_TIMEOUT_S = 30.0


class Watchdog:
    """The dead-man's switch: when the heartbeat last arrived, and whether its silence has paged.

    Armed by the first heartbeat, so a pager started before Alertmanager does not page.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.last_beat: float | None = None
        self.silent_since: str | None = None  # startsAt of the open WatchdogSilent page
        self._lock = threading.Lock()

    def beat(self, now: float) -> dict[str, Any] | None:
        """A heartbeat arrived; return the resolution to store if the silence had paged."""
        with self._lock:
            self.last_beat = now
            if self.silent_since is None:
                return None
            starts, self.silent_since = self.silent_since, None
        return self._record("resolved", starts, now, f"The Watchdog heartbeat is back after a silence since {starts}.")

    def check(self, now: float) -> dict[str, Any] | None:
        """The page to store if the heartbeat has just gone silent for longer than the timeout."""
        with self._lock:
            if self.last_beat is None or self.silent_since is not None or now - self.last_beat <= self.timeout:
                return None
            self.silent_since = rfc3339_ms(self.last_beat)
            starts = self.silent_since
        return self._record(
            "firing", starts, now,
            f"No Watchdog heartbeat from Alertmanager for {now - self.last_beat:.0f}s (timeout {self.timeout:g}s): "
            "Prometheus or Alertmanager is down, or cannot reach the pager; pages may be lost.",
        )  # fmt: skip

    @staticmethod
    def _record(status: str, starts: str, now: float, description: str) -> dict[str, Any]:
        alert = {
            "status": status,
            "labels": {"alertname": WATCHDOG_SILENT, "severity": "critical"},
            "annotations": {
                "summary": f"The alerting pipeline {'has gone silent' if status == 'firing' else 'is back'}",
                "description": description,
                "runbook_url": f"{RUNBOOK_BASE}/{WATCHDOG_SILENT}.md",
            },
            "fingerprint": "pager-watchdog",
            "startsAt": starts,
            "endsAt": rfc3339_ms(now) if status == "resolved" else "",
        }
        return page_record(alert, rfc3339_ms(now))

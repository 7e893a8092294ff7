"""The pager's own metrics, on an injected registry (every test builds a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from runwatch.oncall.records import STATUSES

# Why a request was refused: each is counted from the start, at 0.
REJECT_REASONS = ("malformed", "too_large", "length_required", "write_failed", "foreign", "unauthorized", "timeout")

# attribute: (kind, name, HELP, its label and every value of it, each of which starts at 0)
METRICS: dict[str, tuple[type[Counter] | type[Gauge], str, str, tuple[str, tuple[str, ...]] | None]] = {
    "notifications": (Counter, "runwatch_pager_notifications_total",
                      "Webhook notifications from Alertmanager that the pager accepted.", None),
    "pages": (Counter, "runwatch_pager_pages_total",
              "New pages stored in the page log, by alert status.", ("status", STATUSES)),
    "duplicates": (Counter, "runwatch_pager_duplicates_total",
                   "Alerts ignored because the same page was already stored.", None),
    "rejected": (Counter, "runwatch_pager_rejected_total",
                 "Webhook requests the pager refused, by reason.", ("reason", REJECT_REASONS)),
    "last_page": (Gauge, "runwatch_pager_last_page_timestamp_seconds",
                  "Unix time at which the most recent new page was stored.", None),
    "watchdog": (Gauge, "runwatch_pager_watchdog_last_timestamp_seconds",
                 "Unix time at which the Watchdog heartbeat from Alertmanager last arrived, 0 if never.", None),
}  # fmt: skip


class PagerMetrics:
    """The pager's own metrics (METRICS), registered on the given registry."""

    notifications: Counter
    pages: Counter
    duplicates: Counter
    rejected: Counter
    last_page: Gauge
    watchdog: Gauge

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry  # what /metrics serves
        for attribute, (kind, name, help_text, label) in METRICS.items():
            metric = kind(name, help_text, [label[0]] if label else [], registry=registry)
            for value in label[1] if label else ():
                metric.labels(value)
            setattr(self, attribute, metric)

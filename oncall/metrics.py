"""The pager's own metrics, on an injected registry (every test builds a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from runwatch.oncall.records import STATUSES

# Why a request was refused: each is counted from the start, at 0.
REJECT_REASONS = ("malformed", "too_large", "length_required", "write_failed", "foreign", "unauthorized", "timeout")


class PagerMetrics:
    """The pager's own metrics, registered on the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry  # what /metrics serves
        self.notifications = Counter(
            "runwatch_pager_notifications_total",
            "Webhook notifications from Alertmanager that the pager accepted.",
            registry=registry,
        )
        self.pages = Counter(
            "runwatch_pager_pages_total",
            "New pages stored in the page log, by alert status.",
            ["status"],
            registry=registry,
        )
        self.duplicates = Counter(
            "runwatch_pager_duplicates_total",
            "Alerts ignored because the same page was already stored.",
            registry=registry,
        )
        self.rejected = Counter(
            "runwatch_pager_rejected_total",
            "Webhook requests the pager refused, by reason.",
            ["reason"],
            registry=registry,
        )
        self.last_page = Gauge(
            "runwatch_pager_last_page_timestamp_seconds",
            "Unix time at which the most recent new page was stored.",
            registry=registry,
        )
        self.watchdog = Gauge(
            "runwatch_pager_watchdog_last_timestamp_seconds",
            "Unix time at which the Watchdog heartbeat from Alertmanager last arrived, 0 if never.",
            registry=registry,
        )
        for status in STATUSES:
            self.pages.labels(status)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)

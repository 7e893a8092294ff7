"""Which pages Prometheus confirms: any local process can post to the pager, so a drill counts
a page only if Prometheus's own record (ALERTS) had its alert firing for the run within the
window in which Alertmanager may send it (not an alert decision: Prometheus made it).

    >>> notification_window_s(Path("alertmanager/alertmanager.yml"))
    12.0
"""

from __future__ import annotations

import re
from pathlib import Path

import requests

from runwatch.drill.routes import DEFAULTS, Route, routes
from runwatch.lab import supervise as lab_mod
from runwatch.lab.argv import RESEND_DELAY_S
from runwatch.oncall.page_log import read_pages
from runwatch.oncall.records import received_time
from runwatch.prom.server import PromQLError, instant, quoted

ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def notification_window_s(alertmanager_yml: Path) -> float:
    """The longest after an evaluation that has an alert firing that Alertmanager may send its
    page: the longest group_wait plus the longest group_interval of its routes (alertmanager.yml;
    group_interval is also when it retries a page the pager did not take), plus Prometheus's
    resend delay. A page that arrives later than this after its alert last fired was not sent for it.

    The routes' timings are those in force, with Alertmanager's inheritance (runwatch.drill.routes);
    an unreadable file counts as Alertmanager's defaults. A duration that is not one is a one-line
    error naming the file.
    """
    import yaml

    try:
        every = routes(alertmanager_yml)
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        every = [Route(Path(alertmanager_yml), (), DEFAULTS, 0)]
    wait = max(r.seconds("group_wait") for r in every)
    interval = max(r.seconds("group_interval") for r in every)
    return wait + interval + RESEND_DELAY_S


def fired_in_prometheus(prometheus: str, page: dict, run_id: str, window: float) -> bool:
    """Whether Prometheus's own record (ALERTS) has this page's alert firing for the run within
    `window` seconds (notification_window_s) before the page arrived. Any local process can post
    to the pager; only Prometheus's rules make ALERTS, so a page without it, or one posted after
    its alert stopped firing, is not counted (not an alert decision: Prometheus made it)."""
    received = received_at(page)
    if received is None or not ALERT_NAME.fullmatch(str(page.get("alert", ""))):
        return False
    at = received + 2  # ALERTS is written when the alert fires, before the notification
    selector = f'ALERTS{{alertname="{page["alert"]}",run_id="{quoted(run_id)}",alertstate="firing"}}'
    try:
        return bool(instant(prometheus, f"count_over_time({selector}[{int(window) + 2}s])", at))
    except (requests.RequestException, PromQLError):
        return False


def first_page(lab: lab_mod.Lab, run_id: str, since: float) -> dict | None:
    """The run's first firing page that Prometheus confirms."""
    for page in read_pages(lab.page_log):
        if page.get("run_id") != run_id or page.get("status") != "firing":
            continue
        if fired_in_prometheus(lab.url("prometheus"), page, run_id, notification_window_s(lab.alertmanager_yml)):
            return page
    return None


def received_at(page: dict | None) -> float | None:
    return None if page is None else received_time(page)

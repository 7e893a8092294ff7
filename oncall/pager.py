"""The on-call pager: receives Alertmanager webhook notifications and keeps a durable page log.

Each new page (one alert in one state) is appended as one JSON line and fsynced before the
webhook gets its 200, so an acknowledged page survives a crash. Alertmanager re-sends alerts
(repeat_interval, group changes, retries); a page is identified by (fingerprint, startsAt,
status), and repeats are counted, not stored. The dedup set is rebuilt from the log on start.

The pager is also the lab's dead-man's switch: Alertmanager posts the always-firing `Watchdog`
alert to /watchdog every few seconds. Once heard, a heartbeat that stops for `watchdog_timeout`
seconds (Prometheus, Alertmanager or the route between them is down) becomes a page of the
pager's own, `WatchdogSilent`, and a resolution when the heartbeat returns. Nothing else in the
lab can page about the alerting pipeline itself, because that pipeline is what carries pages.

Incidents, as PagerDuty, Opsgenie and Grafana OnCall keep them: the pages of one alert of one
run make one incident, which stays open, unacknowledged, whatever its alert does next, until a
person acknowledges it with a comment (POST /api/ack, appended to the same log as an `ack`
line, fsynced, kept once by its ack_id) and its alert has resolved. Re-firing joins it.
The pager groups pages into incidents by alert and run; it never decides whether one fired.

Given a token (`runwatch up` gives it one, and the same to Alertmanager's webhooks as a Bearer
credential), the pager takes a webhook only with that token: a page or a heartbeat posted by
anything that cannot read the lab's state directory is refused with 401 before its body is read.

Do not use this to decide whether an alert should fire; that lives in the PromQL rule files.
Do not point two pager processes at one log: the lock that keeps lines whole is per process.

    >>> server = make_server("127.0.0.1", 0, Path(".runwatch/pages.jsonl"), registry=CollectorRegistry())
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import os
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qs, urlencode, urlsplit
from urllib.request import ProxyHandler, build_opener

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from runwatch.core.addresses import host_allowed, served_hosts

# Runbooks are served by the pager itself, at the address it has in both worlds.
RUNBOOK_BASE = "http://127.0.0.1:9095/runbooks"
ROUTES = {
    "/": "GET",
    "/webhook": "POST",
    "/watchdog": "POST",
    "/-/healthy": "GET",
    "/-/ready": "GET",
    "/metrics": "GET",
    "/api/pages": "GET",
    "/api/incidents": "GET",
    "/api/ack": "POST",
}
STATUSES = ("firing", "resolved")
RUNBOOK_NAME = re.compile(r"[A-Za-z0-9_-]+\.md")  # no slashes, no dots but the suffix: no way out of the folder
DRAIN_LIMIT = 16 << 20  # bytes of an oversized body read and discarded so the client sees the 413
WATCHDOG_SILENT = "WatchdogSilent"
# Alertmanager repeats the Watchdog every 10 s (alertmanager.yml); three missed beats page.
WATCHDOG_TIMEOUT_S = 30.0
# How long a webhook waits for Prometheus's rules before storing its pages without them.
RULES_TIMEOUT_S = 2.0
# Bounded as a production server is (issue 28: 8,000 half-open connections gave the pager 6,800
# threads, and /-/ready timed out for minutes after they closed). A connection waits in one
# selector thread, costing no thread, until a whole request head has come; only then does one
# of WORKERS threads serve it. Alertmanager sends a few notifications at once; the console and
# Prometheus read a page list and /metrics. Measured by benchmarks/bench_slow_connections.py.
WORKERS = 16
MAX_CONNECTIONS = 1024  # waiting at once; past it the oldest that never sent a whole request is closed
HEAD_TIMEOUT_S = 10.0  # for a request's line and headers to arrive, and for each read of a body
IDLE_TIMEOUT_S = 300.0  # a kept-alive connection between requests: Alertmanager keeps one 5 minutes
MAX_HEAD_BYTES = 64 << 10


class PayloadError(ValueError):
    """A webhook payload that cannot be stored; ``field`` names the offending part, e.g. ``alerts[2].status``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def rfc3339_ms(t: float) -> str:
    """Format a Unix time as RFC3339 UTC with milliseconds, e.g. ``2024-05-01T12:00:00.250Z``."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def received_time(page: dict[str, Any]) -> float | None:
    """A page's received_at as a Unix time, or None if it is unreadable (a hand-edited line)."""
    try:
        return datetime.fromisoformat(str(page.get("received_at", "")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _string_map(value: Any, field: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(field, f"must be an object of string to string, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise PayloadError(f"{field}.{key}", f"must be a string, got {type(item).__name__}")
    return value


def validate_payload(payload: Any) -> list[dict[str, Any]]:
    """Check a whole Alertmanager v4 webhook payload and return its alerts; raise PayloadError on the first bad field.

    Do not use this on partial payloads: it checks everything so that nothing is stored from a bad one.

        >>> validate_payload({"alerts": []})
        []
    """
    if not isinstance(payload, dict):
        raise PayloadError("body", f"must be a JSON object, got {type(payload).__name__}")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts", "must be a list of alerts" if "alerts" in payload else "is missing")
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            raise PayloadError(where, f"must be an object, got {type(alert).__name__}")
        for key in ("status", "labels", "fingerprint", "startsAt"):
            if key not in alert:
                raise PayloadError(f"{where}.{key}", "is missing")
            if key == "status" and alert[key] not in STATUSES:
                raise PayloadError(f"{where}.status", f'must be "firing" or "resolved", got {alert[key]!r}')
            if key in ("fingerprint", "startsAt") and (not isinstance(alert[key], str) or not alert[key]):
                raise PayloadError(f"{where}.{key}", "must be a non-empty string")
        if not isinstance(alert.get("endsAt", ""), str):
            raise PayloadError(f"{where}.endsAt", "must be a string")
        _string_map(alert["labels"], f"{where}.labels")
        _string_map(alert.get("annotations", {}), f"{where}.annotations")
    return alerts


def rules_in_force(prometheus: str, timeout: float = RULES_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """Each alerting rule's expression, `for:` and thresholds as Prometheus holds them now, by alert name.

    A page stores its alert's rule, so it quotes the threshold that fired it, whatever a
    description says and however the rule is edited later. A model alert reads its threshold
    from a recording rule labelled with its name (alerts.yml's alert:runwatch_threshold:ratio),
    so "thresholds" holds every recording rule labelled alertname=<this alert>, as
    name{labels} -> expression. Empty if Prometheus does not answer within timeout: pages are
    stored all the same, without their rule.

        >>> rules_in_force("http://127.0.0.1:9090")["HeldOutGap"]["thresholds"]
        {'alert:runwatch_threshold:ratio{alertname="HeldOutGap"}': 'vector(2)'}
    """
    if not prometheus:
        return {}
    # In a thread, so that the whole lookup, name resolution included (which a socket timeout
    # does not bound, and which Podman's DNS can stall for seconds), delays pages by at most
    # timeout. A lookup still running then finishes on its own and is dropped.
    found: dict[str, dict[str, Any]] = {}
    lookup = threading.Thread(target=_read_rules, args=(prometheus, timeout, found), daemon=True)
    lookup.start()
    lookup.join(timeout)
    return dict(found) if not lookup.is_alive() else {}


def _read_rules(prometheus: str, timeout: float, found: dict[str, dict[str, Any]]) -> None:
    opener = build_opener(ProxyHandler({}))  # the lab's Prometheus is local: never through a proxy
    try:
        with opener.open(f"{prometheus.rstrip('/')}/api/v1/rules", timeout=timeout) as resp:
            groups = json.loads(resp.read())["data"]["groups"]
        every = [r for g in groups for r in g["rules"]]
        thresholds: dict[str, dict[str, str]] = {}  # alert name -> {name{labels}: expression}
        for r in (r for r in every if r.get("type") == "recording" and (r.get("labels") or {}).get("alertname")):
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(r["labels"].items()))
            thresholds.setdefault(str(r["labels"]["alertname"]), {})[f"{r['name']}{{{labels}}}"] = str(r["query"])
        read: dict[str, dict[str, Any]] = {}
        for r in (r for r in every if r.get("type") == "alerting"):  # in two groups: the first, as listed
            name = str(r["name"])
            read.setdefault(
                name,
                {"expr": str(r["query"]), "for": f"{float(r.get('duration', 0)):g}s",
                 "thresholds": thresholds.get(name, {})},
            )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # OSError covers URLError and timeouts
        return
    found.update(read)


# A comparison an alert ends in, and the threshold that makes it hold for every value
ALWAYS_HOLDS = {">": "-Inf", ">=": "-Inf", "<": "+Inf", "<=": "+Inf"}


def value_at_resolution(prometheus: str, rule: dict[str, Any] | None, alert: dict[str, Any],
                        timeout: float = RULES_TIMEOUT_S) -> float | None:  # fmt: skip
    """What the alert's rule measured when the alert resolved (its endsAt), as Prometheus
    evaluates it: a resolved notification carries the annotations of the last firing
    evaluation, so its description quotes a value the run no longer has.

    Only for a rule of the form MEASURE OP scalar(THRESHOLD RULE) (alerts.yml's model alerts):
    Prometheus parses the expression and names its comparison; the threshold rule's selector is
    put to the value that makes that comparison hold for every measure, and Prometheus
    evaluates the result at endsAt. Python compares nothing. None where it cannot say.

        >>> value_at_resolution("http://127.0.0.1:9090", page["rule"], alert)
        1.62
    """
    thresholds = (rule or {}).get("thresholds") or {}
    expr = str((rule or {}).get("expr", ""))
    ends = received_time({"received_at": alert.get("endsAt", "")})
    if not prometheus or len(thresholds) != 1 or ends is None or next(iter(thresholds)) not in expr:
        return None
    found: list[float] = []
    ask = threading.Thread(target=_measure, args=(prometheus, expr, next(iter(thresholds)), ends, alert, found),
                           daemon=True)  # fmt: skip
    ask.start()
    ask.join(timeout)
    return found[0] if found and not ask.is_alive() else None


def _measure(prometheus: str, expr: str, selector: str, at: float, alert: dict[str, Any], found: list) -> None:
    opener = build_opener(ProxyHandler({}))
    base = prometheus.rstrip("/")
    try:
        with opener.open(f"{base}/api/v1/parse_query?{urlencode({'query': expr})}", timeout=RULES_TIMEOUT_S) as resp:
            tree = json.loads(resp.read())["data"]
        fill = (
            ALWAYS_HOLDS.get(tree.get("op", "")) if tree.get("type") == "binaryExpr" and not tree.get("bool") else None
        )
        if fill is None:
            return
        query = urlencode({"query": expr.replace(selector, f"vector({fill})"), "time": f"{at:.3f}"})
        with opener.open(f"{base}/api/v1/query?{query}", timeout=RULES_TIMEOUT_S) as resp:
            result = json.loads(resp.read())["data"]["result"]
        labels = alert.get("labels", {})
        mine = [r for r in result if all(labels.get(k) == v for k, v in r["metric"].items() if k != "__name__")]
        if len(mine) == 1:
            found.append(float(mine[0]["value"][1]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return


def page_record(alert: dict[str, Any], received_at: str, rule: dict[str, str] | None = None) -> dict[str, Any]:
    """Turn one validated alert into the page record stored as one line of the page log.

    rule: the alert's rule in force when the page came ({"expr", "for", "thresholds"}), None if unknown.
    """
    labels, annotations = alert["labels"], alert.get("annotations", {})
    return {
        "received_at": received_at,
        "alert": labels.get("alertname", ""),
        "status": alert["status"],
        "severity": labels.get("severity", ""),
        "run_id": labels.get("run_id", ""),
        "step": annotations.get("step", ""),
        "summary": annotations.get("summary", ""),
        "description": annotations.get("description", ""),
        "runbook_url": annotations.get("runbook_url", ""),
        "rule": rule,
        "fingerprint": alert["fingerprint"],
        "starts_at": alert["startsAt"],
        "ends_at": alert.get("endsAt", ""),
        "labels": labels,
        "annotations": annotations,
    }


def _page_key(page: dict[str, Any]) -> tuple[str, str, str]:
    if page.get("kind") == "ack":  # an ack is kept once by the id its sender gave it
        return ("ack", str(page.get("ack_id", "")), "")
    # str(): a hand-edited line's list or mapping must not stop the pager (unhashable; issue 40, P1)
    return (str(page.get("fingerprint", "")), str(page.get("starts_at", "")), str(page.get("status", "")))


def is_page(entry: dict[str, Any]) -> bool:
    """Whether a line of the log is a page (the log also holds acks, `"kind": "ack"`)."""
    return entry.get("kind", "page") == "page"


# --- incidents: the pages of one alert of one run, and what people did about them ---

TRIGGERED, ACKNOWLEDGED, RESOLVED = "triggered", "acknowledged", "resolved"


def incidents(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group the log's lines (oldest first) into incidents, one per (alert, run): open ones first,
    oldest first, then the resolved ones, oldest first.

    An incident is "triggered" until acknowledged, "acknowledged" while any of its alert's
    series still fires, "resolved" once acknowledged and every series has resolved. Its
    "events" are its state changes, oldest first: each page ("fired"/"resolved") and the ack.
    An ack of an (alert, run) with no page is not an incident and is left out.

        >>> [i["state"] for i in incidents(read_log(Path(".runwatch/pages.jsonl")))]
        ['triggered', 'resolved']
    """
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in entries:
        key = (str(entry.get("alert", "")), str(entry.get("run_id", "")))
        if not is_page(entry):
            incident = found.get(key)
            if incident is None or entry.get("kind") != "ack" or incident["acked_at"]:
                continue  # an ack of no incident, or a second one: the first ack is the ack
            incident.update(acked_at=entry.get("received_at", ""), acked_by=entry.get("by", ""),
                            comment=entry.get("comment", ""))  # fmt: skip
            incident["events"].append({"at": entry.get("received_at", ""), "what": "acknowledged",
                                       "by": entry.get("by", ""), "comment": entry.get("comment", "")})  # fmt: skip
            continue
        incident = found.setdefault(key, {
            "alert": key[0], "run_id": key[1], "severity": entry.get("severity", ""),
            "opened_at": entry.get("received_at", ""), "first_page": None, "acked_at": "", "acked_by": "",
            "comment": "", "resolved_at": "", "pages": [], "events": [], "_firing": set(),
        })  # fmt: skip
        incident["pages"].append(entry)
        series = entry.get("fingerprint", "")
        if entry.get("status") == "firing":
            incident["_firing"].add(series)
            if incident["first_page"] is None:
                incident["first_page"] = entry.get("received_at", "")
        else:
            incident["_firing"].discard(series)
        what = "fired" if entry.get("status") == "firing" else "resolved"
        incident["events"].append({"at": entry.get("received_at", ""), "what": what, "step": entry.get("step", "")})
    out = []
    for incident in found.values():
        firing = incident.pop("_firing")
        incident["firing"] = bool(firing)
        incident["first_page"] = incident["first_page"] or incident["opened_at"]
        if not incident["acked_at"]:
            incident["state"] = TRIGGERED
        elif firing:
            incident["state"] = ACKNOWLEDGED
        else:
            incident["state"] = RESOLVED
            last = [e["at"] for e in incident["events"] if e["what"] in ("resolved", "acknowledged")]
            incident["resolved_at"] = max(last) if last else ""
        out.append(incident)
    return sorted(out, key=lambda i: (i["state"] == RESOLVED, i["first_page"]))


def time_to_ack(incident: dict[str, Any]) -> float | None:
    """Seconds from an incident's first page to its ack, None while unacknowledged."""
    first = received_time({"received_at": incident["first_page"]})
    acked = received_time({"received_at": incident["acked_at"]}) if incident["acked_at"] else None
    return None if first is None or acked is None else round(acked - first, 1)


def ack_record(body: Any, received_at: str) -> dict[str, Any]:
    """Check a POST /api/ack body and return the ack line to store; raise PayloadError on a bad field.

    >>> body = {"alert": "HeldOutGap", "run_id": "r", "comment": "looking", "by": "ada", "ack_id": "1"}
    >>> ack_record(body, "2024-05-01T12:00:05.000Z")["kind"]
    'ack'
    """
    if not isinstance(body, dict):
        raise PayloadError("body", f"must be a JSON object, got {type(body).__name__}")
    for key in ("alert", "run_id", "comment", "by", "ack_id"):
        if not isinstance(body.get(key), str):
            raise PayloadError(key, "is missing" if key not in body else "must be a string")
    for key in ("alert", "comment", "by", "ack_id"):
        if not body[key].strip():
            raise PayloadError(key, "must not be empty" + (": say what you know so far" if key == "comment" else ""))
    silence = body.get("silence", "")
    if not isinstance(silence, str):
        raise PayloadError("silence", "must be a string")
    return {
        "kind": "ack", "received_at": received_at, "alert": body["alert"], "run_id": body["run_id"],
        "comment": body["comment"], "by": body["by"], "ack_id": body["ack_id"], "silence": silence,
    }  # fmt: skip


def _parse_pages(data: bytes, log_path: Path, stderr: TextIO | None) -> list[dict[str, Any]]:
    pages = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            page = json.loads(line)
        except (ValueError, RecursionError):  # torn, or nested too deeply to be a page
            page = None
        if isinstance(page, dict):
            pages.append(page)
        elif stderr is not None:
            print(f"runwatch pager: skipping unreadable line {number} of {log_path} (torn by a crash?)", file=stderr)
    return pages


def read_log(log_path: Path, stderr: TextIO | None = None) -> list[dict[str, Any]]:
    """Return every line of the log, pages and acks, oldest first, skipping torn or unreadable lines.

    Pass ``stderr`` to be told which lines were skipped. A missing log has none.
    """
    log_path = Path(log_path)
    return _parse_pages(log_path.read_bytes(), log_path, stderr) if log_path.exists() else []


def read_pages(log_path: Path, stderr: TextIO | None = None) -> list[dict[str, Any]]:
    """Return every page in the log, oldest first, skipping torn or unreadable lines (and acks).

    Pass ``stderr`` to be told which lines were skipped. A missing log has no pages.

        >>> [p["alert"] for p in read_pages(Path(".runwatch/pages.jsonl"))]
        ['TrainingLossJump']
    """
    return [p for p in read_log(log_path, stderr) if is_page(p)]


def read_incidents(log_path: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """The log's incidents (see incidents()), only those of run_id if given."""
    found = incidents(read_log(log_path))
    return found if run_id is None else [i for i in found if i["run_id"] == run_id]


class PageLog:
    """The append-only, fsynced page log and the dedup set rebuilt from it.

    Do not write to the log file from elsewhere while a PageLog holds it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        data = self.path.read_bytes() if self.path.exists() else b""
        pages = _parse_pages(data, self.path, sys.stderr)
        self.seen = {_page_key(p) for p in pages}
        last = pages[-1].get("received_at", "") if pages else ""
        self.last_received = last if isinstance(last, str) else ""  # a hand-edited null (issue 40, P1)
        # A torn last line has no newline; the next append must not glue onto it.
        self._needs_newline = bool(data) and not data.endswith(b"\n")
        self.error: str | None = None  # why the last append failed; None once one succeeds

    def writable(self) -> str | None:
        """Why the log cannot be appended to now (a read-only file or file system), or None.

        Probed by opening it for appending, as a store does: write permission bits say nothing
        to root, and a read-only mount or an immutable file refuses only the open.
        """
        if not self.path.exists():
            ok = os.access(self.path.parent, os.W_OK)
            return None if ok else f"cannot create {self.path}: its folder is not writable"
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND))
        except OSError as err:
            return f"cannot append to {self.path}: {err.strerror or err}"
        return None

    def store(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Append the records not seen before in one fsynced write; return (stored, duplicates)."""
        with self._lock:
            new, keys = [], set()
            for record in records:
                key = _page_key(record)
                if key not in self.seen and key not in keys:
                    new.append(record)
                    keys.add(key)
            if new:
                data = "".join(json.dumps(r) + "\n" for r in new).encode()
                self._append(b"\n" + data if self._needs_newline else data)
                self.seen |= keys
            return new, len(records) - len(new)

    def acknowledge(self, record: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """Store an ack line if its incident is open and unacknowledged; return (the incident
        after it, "") or (None, why not). An ack_id already stored returns its incident again,
        so a retried ack is kept once."""
        with self._lock:
            key = (record["alert"], record["run_id"])
            entries = _parse_pages(self.path.read_bytes(), self.path, None) if self.path.exists() else []
            if _page_key(record) not in self.seen:
                found = {(i["alert"], i["run_id"]): i for i in incidents(entries)}.get(key)
                if found is None:
                    run = record["run_id"] or "-"
                    return None, f"{record['alert']} has no incident for run {run}: it has not paged"
                if found["acked_at"]:
                    return None, (f"{record['alert']} of run {record['run_id'] or '-'} was already acknowledged "
                                  f"by {found['acked_by']} at {found['acked_at'][11:19]}")  # fmt: skip
                data = (json.dumps(record) + "\n").encode()
                self._append(b"\n" + data if self._needs_newline else data)
                self.seen.add(_page_key(record))
                entries.append(record)
            else:  # a retry only if the id acknowledged this very incident (issue 40, N17)
                kept = [e for e in entries if _page_key(e) == _page_key(record)]
                if not kept or (kept[0].get("alert"), kept[0].get("run_id")) != key:
                    was = f"{kept[0].get('alert')} of run {kept[0].get('run_id') or '-'}" if kept else "another ack"
                    return None, f"ack_id {record['ack_id']} already acknowledged {was}: send a new ack_id"
            found = {(i["alert"], i["run_id"]): i for i in incidents(entries)}.get(key)
            return (found, "") if found is not None else (None, f"{record['alert']} has no incident")

    def _append(self, data: bytes) -> None:
        """Append data whole and fsynced, or not at all: on a failed write (a full disk) the log
        is cut back to where it was, so Alertmanager's retry stores each page once."""
        created = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:  # a read-only log or file system: /-/ready says so too
            self.error = f"cannot append to {self.path}: {err.strerror or err}"
            raise
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as err:
                try:
                    os.ftruncate(fd, size)
                except OSError:  # the log may now end in a torn line: start the next on a new one
                    self._needs_newline = True
                self.error = f"cannot append to {self.path}: {err.strerror or err}"
                raise
        finally:
            os.close(fd)
        if created:  # make the new file's directory entry durable too
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._needs_newline, self.error = False, None


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


class PagerMetrics:
    """The pager's own metrics, registered on the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
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
        for reason in ("malformed", "too_large", "length_required", "write_failed", "foreign", "unauthorized"):
            self.rejected.labels(reason)


class _Prefixed(io.RawIOBase):
    """A connection's bytes: those the waiting room already read, then the socket's."""

    def __init__(self, head: bytes, sock: socket.socket) -> None:
        self.head, self.sock = memoryview(head), sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n], self.head = self.head[:n], self.head[n:]
            return n
        try:
            return self.sock.recv_into(buffer)
        except BlockingIOError:
            return None


class _WaitingRoom:
    """Connections that have no whole request yet, in one selector thread: a half-open or
    stalled connection holds a socket here, never a thread. A whole request head goes to the
    server's worker pool; a connection silent past its deadline, or one too many, is closed."""

    def __init__(self, server: PagerServer) -> None:
        self.server = server
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        # sock -> [address, bytes so far, deadline, served before], oldest first
        self.waiting: dict[socket.socket, list] = {}
        self.busy = 0  # connections a worker holds
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._run, name="pager-waiting-room", daemon=True)
        self.thread.start()

    def admit(self, sock: socket.socket, address: Any, head: bytes = b"", idle: bool = False) -> None:
        """A connection to wait for its next request; when the room is full, the oldest that has
        never sent a whole request makes way (a client that sends its request at once, as
        Alertmanager and a probe do, is served however many stalled ones there are)."""
        with self.lock:
            oldest = None
            if len(self.waiting) >= MAX_CONNECTIONS:
                fresh = (s for s, entry in self.waiting.items() if not entry[3])
                oldest = next(fresh, None) or next(iter(self.waiting))
            sock.setblocking(False)
            deadline = time.monotonic() + (IDLE_TIMEOUT_S if idle and not head else HEAD_TIMEOUT_S)
            self.waiting[sock] = [address, bytearray(head), deadline, idle]
        if oldest is not None:
            self._drop(oldest)
        if head and b"\r\n\r\n" in head:  # a pipelined request already here
            self._dispatch(sock)
            return
        self.selector.register(sock, selectors.EVENT_READ)
        self.wake_w.send(b"x")

    def done(self) -> None:
        with self.lock:
            self.busy -= 1

    def close(self) -> None:
        with self.lock:
            socks, self.waiting = list(self.waiting), {}
        for sock in socks:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(sock)
            self.server.shutdown_request(sock)
        with contextlib.suppress(OSError):
            self.wake_w.send(b"x")

    def _run(self) -> None:
        while not self.server.stopped.is_set():
            for key, _ in self.selector.select(timeout=1.0):
                if key.fileobj is self.wake_r:
                    with contextlib.suppress(OSError):
                        self.wake_r.recv(4096)
                    continue
                self._read(key.fileobj)
            now = time.monotonic()
            with self.lock:
                late = [sock for sock, entry in self.waiting.items() if entry[2] < now]
            for sock in late:
                self._drop(sock)
        self.selector.close()

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        with self.lock:
            entry = self.waiting.get(sock)
        if entry is None:
            return
        if not data:  # closed by the client
            return self._drop(sock)
        entry[1] += data
        if len(entry[1]) == len(data):  # its first bytes: the head has HEAD_TIMEOUT_S from now
            entry[2] = time.monotonic() + HEAD_TIMEOUT_S
        if b"\r\n\r\n" in entry[1] or len(entry[1]) > MAX_HEAD_BYTES:  # too long: the handler says 431/400
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            self._dispatch(sock)

    def _dispatch(self, sock: socket.socket) -> None:
        with self.lock:
            address, head, _, _ = self.waiting.pop(sock)
            self.busy += 1
        try:
            self.server.pool.submit(self.server.serve_connection, sock, address, bytes(head))
        except RuntimeError:  # the pool is shut down: the server is closing
            self.done()
            self.server.shutdown_request(sock)

    def _drop(self, sock: socket.socket) -> None:
        with self.lock:
            found = self.waiting.pop(sock, None)
        if found is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            self.server.shutdown_request(sock)


class PagerServer(ThreadingHTTPServer):
    """An HTTP server carrying the page log, metrics and settings its handlers need; its
    connections wait in a _WaitingRoom and are served by a pool of WORKERS threads."""

    daemon_threads = True
    request_queue_size = 64  # Alertmanager may send several groups at once

    def __init__(
        self,
        address: tuple[str, int],
        log: PageLog,
        metrics: PagerMetrics,
        registry: CollectorRegistry,
        max_body: int,
        clock: Callable[[], float],
    ) -> None:
        self.stopped = threading.Event()  # ends the watchdog thread; set before binding, which may fail
        super().__init__(address, _Handler)
        self.log, self.metrics, self.registry = log, metrics, registry
        self.max_body, self.clock = max_body, clock
        self.runbooks: Path | None = None
        self.prometheus = ""  # where the rules in force are read; "" stores pages without them
        self.token: str | None = None  # a webhook must carry it as "Authorization: Bearer TOKEN"; None: any may post
        self.watchdog = Watchdog(WATCHDOG_TIMEOUT_S)
        self.hosts = served_hosts(address[0], self.server_address[1])  # the Host headers the webhook answers
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="pager-worker")
        self.room = _WaitingRoom(self)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A new connection waits in the room (no thread per connection, as ThreadingMixIn has)."""
        self.room.admit(request, client_address)

    def serve_connection(self, sock: socket.socket, address: Any, head: bytes) -> None:
        """One request of a connection, in a worker; a kept-alive connection goes back to wait."""
        keep, rest = False, b""
        try:
            sock.setblocking(True)
            sock.settimeout(HEAD_TIMEOUT_S)
            handler = self.RequestHandlerClass(sock, address, self, head=head)
            keep, rest = not handler.close_connection, handler.rest
        except Exception:
            self.handle_error(sock, address)
        finally:
            self.room.done()
        if keep and not self.stopped.is_set():
            self.room.admit(sock, address, rest, idle=True)
        else:
            self.shutdown_request(sock)

    def server_close(self) -> None:
        self.stopped.set()
        super().server_close()
        if hasattr(self, "room"):  # not if binding failed
            self.room.close()
            self.pool.shutdown(wait=False, cancel_futures=True)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closes or resets its kept-alive connection is normal, not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)

    def record_pages(self, records: list[dict[str, Any]], now: float) -> tuple[list[dict[str, Any]], int]:
        """Store records in the page log and count them; raise OSError if the log cannot be written."""
        stored, duplicates = self.log.store(records)
        self.metrics.duplicates.inc(duplicates)
        for record in stored:
            self.metrics.pages.labels(record["status"]).inc()
        if stored:
            self.metrics.last_page.set(now)
        return stored, duplicates

    def watch(self, stop: threading.Event, every: float = 1.0) -> None:
        """Page once when the Watchdog heartbeat stops (run in a thread until stop is set)."""
        while not stop.wait(every):
            now = self.clock()
            record = self.watchdog.check(now)
            if record is not None:
                try:
                    self.record_pages([record], now)
                except OSError as e:  # the next heartbeat or check tries again
                    print(f"runwatch pager-serve: cannot store {WATCHDOG_SILENT}: {e}", file=sys.stderr)
                    self.watchdog.silent_since = None


class _Handler(BaseHTTPRequestHandler):
    server: PagerServer
    # Keep-alive, as Alertmanager's HTTP client expects: a notification then goes over an open
    # connection and needs no DNS lookup of `pager`. Measured under Podman, whose DNS drops
    # lookups for seconds after any container starts or stops: with a new connection (and a
    # lookup) per notification, a TrainerDown page came 28-52 s late instead of ~12 s.
    protocol_version = "HTTP/1.1"
    # An idle kept-alive connection waits in the server's _WaitingRoom (IDLE_TIMEOUT_S: as
    # long as Alertmanager's client keeps one, prometheus/common's IdleConnTimeout), holding no
    # thread; a handler reads one request, each read within HEAD_TIMEOUT_S.
    timeout = HEAD_TIMEOUT_S

    def __init__(self, request: Any, client_address: Any, server: PagerServer, head: bytes = b"") -> None:
        self.head, self.rest = head, b""
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own file: reads go through what the room read first
        self.rfile = io.BufferedReader(_Prefixed(self.head, self.connection))

    def handle(self) -> None:
        """One request; the waiting room holds the connection until the next one comes."""
        self.close_connection = True
        self.handle_one_request()
        if not self.close_connection:  # what came after this request (pipelined) goes back with it
            self.connection.setblocking(False)
            try:
                self.rest = self.rfile.peek(1 << 16) if self.rfile.peek(1) else b""
                self.rest = self.rfile.read(len(self.rest)) if self.rest else b""
            finally:
                self.connection.setblocking(True)

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if code == 405:
            self.send_header("Allow", ROUTES[urlsplit(self.path).path])
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj: dict[str, Any]) -> None:
        self._reply(code, json.dumps(obj).encode() + b"\n", "application/json")

    def _reject(self, code: int, reason: str, field: str, problem: str) -> None:
        self.server.metrics.rejected.labels(reason).inc()
        # A refused request may have left body bytes unread: they must not be read as the next
        # request on a kept-alive connection, so this one ends here.
        self.close_connection = True
        self._json(code, {"error": f"{field}: {problem}", "field": field})

    def _route(self) -> None:
        path = urlsplit(self.path).path
        if path in ("/runbooks", "/runbooks/") and self.command in ("GET", "HEAD"):
            return self._runbook("README.md")  # the runbooks' own index
        if path.startswith("/runbooks/") and self.command in ("GET", "HEAD"):
            return self._runbook(path.removeprefix("/runbooks/"))
        if path not in ROUTES:
            self._reply(404, f"404 not found: {path}; try POST /webhook, GET /metrics\n".encode())
        elif self.command != ROUTES[path]:
            self._reply(405, f"405 method not allowed: use {ROUTES[path]} {path}\n".encode())
        elif path in ("/webhook", "/watchdog"):
            self._webhook(watchdog=path == "/watchdog")
        elif path == "/metrics":
            self._reply(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/":
            self._reply(200, self._index())
        elif path == "/api/pages":
            self._pages()
        elif path == "/api/incidents":
            self._incidents()
        elif path == "/api/ack":
            self._ack()
        elif path == "/-/ready" and (problem := self.server.log.error or self.server.log.writable()) is not None:
            # Not ready while pages cannot be stored: Alertmanager's retries keep them meanwhile.
            self._reply(503, f"Not ready: {problem}\n".encode(errors="backslashreplace"))
        else:
            self._reply(200, b"OK\n")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _route  # noqa: N815 (http.server's names)

    def _pages(self) -> None:
        """GET /api/pages[?run_id=R]: the page log as JSON, oldest first (the console reads it).

        Read from the file, so it holds exactly what `runwatch pager` prints; a torn last line
        (a write in progress) is left out until it is whole.
        """
        run_ids = parse_qs(urlsplit(self.path).query).get("run_id")
        pages = read_pages(self.server.log.path)
        if run_ids:
            pages = [p for p in pages if p.get("run_id") in run_ids]
        self._json(200, {"pages": pages})

    def _incidents(self) -> None:
        """GET /api/incidents[?run_id=R]: the incidents, open ones first, oldest first."""
        run_ids = parse_qs(urlsplit(self.path).query).get("run_id")
        found = incidents(read_log(self.server.log.path))
        if run_ids:
            found = [i for i in found if i["run_id"] in run_ids]
        self._json(200, {"incidents": found})

    def _ack(self) -> None:
        """POST /api/ack {alert, run_id, comment, by, ack_id[, silence]}: acknowledge an open incident.

        200 with the incident; 409 if it has not paged or is already acknowledged; 400 on a bad field;
        403 from a web page (as the webhook: its Host, an Origin, a body that is not JSON).
        """
        foreign = self._foreign() or (
            None if self.headers.get("Content-Type", "").split(";")[0].strip().lower() == "application/json"
            else f"Content-Type must be application/json, got {self.headers.get('Content-Type', '')!r}"
        )  # fmt: skip
        if foreign is not None:
            return self._reject(403, "foreign", "headers", foreign)
        header = self.headers.get("Content-Length", "")
        length = int(header) if header.strip().isdigit() else -1
        if length < 0 or length > self.server.max_body:
            limit = self.server.max_body
            return self._reject(400, "malformed", "Content-Length", f"must be a byte count up to {limit}")
        try:
            try:
                body = json.loads(self.rfile.read(length))
            except (ValueError, RecursionError):
                raise PayloadError("body", "is not a JSON object") from None
            record = ack_record(body, rfc3339_ms(self.server.clock()))
        except PayloadError as e:
            return self._reject(400, "malformed", e.field, str(e).split(": ", 1)[1])
        try:
            incident, why = self.server.log.acknowledge(record)
        except OSError as e:
            return self._reject(500, "write_failed", "page log", f"cannot append to {self.server.log.path}: {e}")
        if incident is None:
            return self._json(409, {"error": why, "field": "alert"})
        self._json(200, {"incident": incident})

    def _index(self) -> bytes:
        """What a browser opening the pager's address reads: its routes and its runbooks."""
        folder = self.server.runbooks
        names = sorted(p.name for p in folder.glob("*.md") if RUNBOOK_NAME.fullmatch(p.name)) if folder else []
        lines = ["runwatch pager: Alertmanager's webhook receiver and the lab's page log.", ""]
        lines += [f"  {method:4s} {route}" for route, method in ROUTES.items() if route != "/"]
        lines += ["", "Runbooks:", *(f"  {RUNBOOK_BASE}/{name}" for name in names)]
        lines += ["", "Pages: `runwatch pager` (or --follow) prints them, with their runbooks."]
        return ("\n".join(lines) + "\n").encode()

    def _runbook(self, name: str) -> None:
        """Serve runbooks/<AlertName>.md, so dashboards and pages can link to them; a symlink
        (runbooks/X.md -> /etc/shadow) is not a runbook, whatever it points at."""
        folder = self.server.runbooks
        path = folder / name if folder is not None and RUNBOOK_NAME.fullmatch(name) else None
        if path is None or path.is_symlink() or not path.is_file():
            return self._reply(404, f"404 no runbook {name!r}\n".encode())
        self._reply(200, path.read_bytes(), "text/markdown; charset=utf-8")

    def _foreign(self) -> str | None:
        """Why this request is not Alertmanager's, from its headers alone, or None.

        A web page in the learner's browser can POST here (fetch with mode "no-cors" sends
        text/plain, and a DNS-rebinding page sends its own Host); Alertmanager sends JSON, to an
        address of the pager's, and never an Origin.
        """
        if not host_allowed(self.headers.get("Host"), self.server.hosts):
            served = ", ".join(sorted(self.server.hosts))
            return f"Host {self.headers.get('Host')!r} is not the pager's (it answers as {served})"
        if "Origin" in self.headers:
            return f"a browser's request (Origin {self.headers['Origin']!r}); only Alertmanager posts here"
        return None

    def _webhook(self, watchdog: bool = False) -> None:
        foreign = self._foreign()  # before the body is read: a refused request costs nothing
        if foreign is not None:
            return self._reject(403, "foreign", "headers", foreign)
        token = self.server.token
        if token is not None and not hmac.compare_digest(
            self.headers.get("Authorization", "").encode(), f"Bearer {token}".encode()
        ):
            problem = "missing" if "Authorization" not in self.headers else "does not carry the lab's token"
            problem += "; only the lab's Alertmanager posts here"
            return self._reject(401, "unauthorized", "Authorization", problem)
        header = self.headers.get("Content-Length")
        if header is None:
            return self._reject(411, "length_required", "Content-Length", "header is required")
        length = int(header) if header.strip().isascii() and header.strip().isdigit() else -1
        if length < 0:
            return self._reject(400, "malformed", "Content-Length", f"must be a byte count, got {header!r}")
        if self.headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/json":
            # what fetch(url, {mode: "no-cors"}) sends: text/plain, a form, or none
            found = self.headers.get("Content-Type", "")
            return self._reject(403, "foreign", "headers", f"Content-Type must be application/json, got {found!r}")
        if length > self.server.max_body:
            # Read and drop the body in small chunks, so the client is not reset before it reads the 413.
            remaining = min(length, DRAIN_LIMIT)
            while remaining > 0 and (chunk := self.rfile.read(min(remaining, 1 << 16))):
                remaining -= len(chunk)
            return self._reject(413, "too_large", "body", f"{length} bytes exceeds the limit of {self.server.max_body}")
        body = self.rfile.read(length)
        try:
            if len(body) != length:
                raise PayloadError("body", f"got {len(body)} of the {length} bytes in Content-Length")
            try:
                payload = json.loads(body)
            except ValueError as e:
                raise PayloadError("body", f"is not valid UTF-8 JSON ({e})") from None
            except RecursionError:
                raise PayloadError("body", "is nested too deeply to be an Alertmanager payload") from None
            alerts = validate_payload(payload)
        except PayloadError as e:
            return self._reject(400, "malformed", e.field, str(e).split(": ", 1)[1])
        now = self.server.clock()
        if watchdog:
            # A firing Watchdog is the heartbeat; a resolved one means Prometheus stopped sending it.
            records = []
            if any(a["status"] == "firing" for a in alerts):
                self.server.metrics.watchdog.set(now)
                records = [r for r in [self.server.watchdog.beat(now)] if r is not None]
        else:
            rules = rules_in_force(self.server.prometheus) if alerts else {}
            records = [page_record(a, rfc3339_ms(now), rules.get(a["labels"].get("alertname", ""))) for a in alerts]
            for record, a in zip(records, alerts, strict=True):
                if record["status"] == "resolved" and record["rule"] and _page_key(record) not in self.server.log.seen:
                    record["value_at_resolution"] = value_at_resolution(self.server.prometheus, record["rule"], a)
        try:
            stored, duplicates = self.server.record_pages(records, now)
        except OSError as e:
            return self._reject(500, "write_failed", "page log", f"cannot append to {self.server.log.path}: {e}")
        self.server.metrics.notifications.inc()
        self._json(200, {"stored": len(stored), "duplicates": duplicates})


def make_server(
    host: str,
    port: int,
    log_path: Path,
    registry: CollectorRegistry | None = None,
    max_body: int = 1 << 20,
    clock: Callable[[], float] = time.time,
    runbooks: Path | None = None,
    watchdog_timeout: float = WATCHDOG_TIMEOUT_S,
    prometheus: str = "",
    allow_hosts: tuple[str, ...] | list[str] = (),
    token: str | None = None,
) -> PagerServer:
    """Load the page log and bind the pager to host:port (0 picks a free port); call serve_forever() to run it.

    Do not use this for a quick look at pages; read_pages() reads the log without a server.

        >>> server = make_server("127.0.0.1", 0, Path(".runwatch/pages.jsonl"), registry=CollectorRegistry())
        >>> server.server_address[1] > 0
        True
    """
    registry = CollectorRegistry() if registry is None else registry
    log = PageLog(log_path)
    metrics = PagerMetrics(registry)
    with contextlib.suppress(ValueError):  # an empty log or a hand-edited received_at leaves the gauge at 0
        metrics.last_page.set(datetime.fromisoformat(log.last_received).timestamp())
    server = PagerServer((host, port), log, metrics, registry, max_body, clock)
    server.runbooks = runbooks  # GET /runbooks/<Alert>.md serves this folder's runbooks
    server.watchdog.timeout = watchdog_timeout
    server.prometheus = prometheus  # each page stores its alert's rule in force, read from here
    server.hosts = served_hosts(host, server.server_address[1], allow_hosts)  # e.g. compose's `pager`
    server.token = token  # the webhooks' Bearer token, if any
    threading.Thread(target=server.watch, args=(server.stopped,), name="watchdog", daemon=True).start()
    return server

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

Do not use this to decide whether an alert should fire; that lives in the PromQL rule files.
Do not point two pager processes at one log: the lock that keeps lines whole is per process.

    >>> server = make_server("127.0.0.1", 0, Path(".runwatch/pages.jsonl"), registry=CollectorRegistry())
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()
"""

from __future__ import annotations

import contextlib
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
from urllib.parse import parse_qs, urlsplit
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
    return (page.get("fingerprint", ""), page.get("starts_at", ""), page.get("status", ""))


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


def read_pages(log_path: Path, stderr: TextIO | None = None) -> list[dict[str, Any]]:
    """Return every page in the log, oldest first, skipping torn or unreadable lines.

    Pass ``stderr`` to be told which lines were skipped. A missing log has no pages.

        >>> [p["alert"] for p in read_pages(Path(".runwatch/pages.jsonl"))]
        ['TrainingLossJump']
    """
    log_path = Path(log_path)
    return _parse_pages(log_path.read_bytes(), log_path, stderr) if log_path.exists() else []


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
        self.last_received = pages[-1].get("received_at", "") if pages else ""
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
        for reason in ("malformed", "too_large", "length_required", "write_failed", "foreign"):
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
    threading.Thread(target=server.watch, args=(server.stopped,), name="watchdog", daemon=True).start()
    return server

"""The pager's web app: Alertmanager's webhooks in, the page log and its incidents out, acks in,
and the runbooks served. An ASGI app, served by uvicorn with the console's bounds (oncall/server.py).

Every POST is judged on its headers before any byte of its body is awaited:
- a browser's request (an Origin, a Host that is not the pager's, a body that is not JSON) is
  refused with 403;
- given a token (`runwatch up` gives it one, and the same to Alertmanager's webhooks and to
  `runwatch ack` as a Bearer credential), a POST without it is refused with 401;
- then Content-Length is checked, and only then is the body read, all of it within
  `body_timeout` seconds.
A refused request closes its connection, so bytes it still sends are never read as a request.
A slow or tokenless client costs a coroutine, never one of the WORKERS threads that store pages.

Do not use this to decide whether an alert should fire; that lives in the PromQL rule files.

    >>> app = PagerApp(Pager(PageLog(Path(".runwatch/pages.jsonl")), PagerMetrics(CollectorRegistry())))
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from runwatch.core.addresses import host_allowed, served_hosts
from runwatch.core.names import LOOPBACK, RUNBOOK_BASE
from runwatch.oncall.incidents import incidents
from runwatch.oncall.metrics import PagerMetrics
from runwatch.oncall.page_log import PageLog, read_log, read_pages
from runwatch.oncall.prometheus import rules_in_force, value_at_resolution
from runwatch.oncall.records import PayloadError, ack_record, page_key, page_record, rfc3339_ms, validate_payload
from runwatch.oncall.watchdog import WATCHDOG_SILENT, WATCHDOG_TIMEOUT_S, Watchdog

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
RUNBOOK_NAME = re.compile(r"[A-Za-z0-9_-]+\.md")  # no slashes, no dots but the suffix: no way out of the folder
DRAIN_LIMIT = 16 << 20  # bytes of an oversized body read and discarded so the client sees the 413
# Threads for what blocks (an fsynced append, a read of the log, Prometheus's rules): Alertmanager
# sends a few notifications at once; the console and Prometheus read a page list and /metrics.
WORKERS = 16
TEXT = "text/plain; charset=utf-8"


class RefusedError(Exception):
    """A request the pager refuses: its status, the reason it is counted under, the field it names."""

    def __init__(self, status: int, reason: str, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.status, self.reason, self.field = status, reason, field


class Pager:
    """What the app serves from: the page log, its metrics, the watchdog and the pager's settings.

    token: a POST must carry it as "Authorization: Bearer TOKEN"; None: any local process may post.
    prometheus: where each page's rule in force is read; "" stores pages without it.
    """

    def __init__(self, log: PageLog, metrics: PagerMetrics, max_body: int = 1 << 20,
                 clock: Callable[[], float] = time.time, runbooks: Path | None = None, prometheus: str = "",
                 hosts: frozenset[str] = served_hosts(LOOPBACK, 0), token: str | None = None,
                 watchdog_timeout: float = WATCHDOG_TIMEOUT_S) -> None:  # fmt: skip
        self.log, self.metrics = log, metrics
        self.max_body, self.clock, self.runbooks, self.prometheus = max_body, clock, runbooks, prometheus
        self.hosts, self.token = hosts, token
        self.watchdog = Watchdog(watchdog_timeout)
        with contextlib.suppress(ValueError):  # an empty log or a hand-edited received_at leaves the gauge at 0
            metrics.last_page.set(datetime.fromisoformat(log.last_received).timestamp())

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


def _json(code: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(obj).encode() + b"\n", code, headers=headers, media_type="application/json")


class PagerApp:
    """The ASGI app over a Pager. body_timeout: seconds for a whole request body to arrive."""

    def __init__(self, pager: Pager, body_timeout: float = 10.0) -> None:
        self.pager, self.body_timeout = pager, body_timeout
        self._workers: anyio.CapacityLimiter | None = None  # made in the server's event loop

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # no lifespan, no websockets
            return
        request = Request(scope, receive)
        try:
            response = await self._route(request)
        except RefusedError as e:
            self.pager.metrics.rejected.labels(e.reason).inc()
            # A refused request may still be sending its body: the connection ends with it.
            response = _json(e.status, {"error": str(e), "field": e.field}, {"Connection": "close"})
        await response(scope, receive, send)

    async def _blocking(self, function: Callable, *args: Any) -> Any:
        """Run what blocks (the disk, Prometheus) on one of WORKERS threads."""
        if self._workers is None:
            self._workers = anyio.CapacityLimiter(WORKERS)
        return await anyio.to_thread.run_sync(function, *args, limiter=self._workers)

    async def _route(self, request: Request) -> Response:
        path, method = request.url.path, request.method
        if path in ("/runbooks", "/runbooks/") and method in ("GET", "HEAD"):
            return await self._blocking(self._runbook, "README.md")  # the runbooks' own index
        if path.startswith("/runbooks/") and method in ("GET", "HEAD"):
            return await self._blocking(self._runbook, path.removeprefix("/runbooks/"))
        if path not in ROUTES:
            return Response(f"404 not found: {path}; try POST /webhook, GET /metrics\n".encode(), 404, media_type=TEXT)
        if method != ROUTES[path]:
            body = f"405 method not allowed: use {ROUTES[path]} {path}\n".encode()
            return Response(body, 405, headers={"Allow": ROUTES[path]}, media_type=TEXT)
        if path in ("/webhook", "/watchdog"):
            return await self._webhook(request, watchdog=path == "/watchdog")
        if path == "/api/ack":
            return await self._ack(request)
        return await self._blocking(self._read, path, request.query_params.getlist("run_id"))

    def _read(self, path: str, run_ids: list[str]) -> Response:
        """The GET routes: each reads the log or the metrics, and answers."""
        pager = self.pager
        if path == "/metrics":
            return Response(generate_latest(pager.metrics.registry), 200, media_type=CONTENT_TYPE_LATEST)
        if path == "/":
            return Response(self._index(), 200, media_type=TEXT)
        if path == "/api/pages":
            # Read from the file, so it holds exactly what `runwatch pager` prints; a torn last
            # line (a write in progress) is left out until it is whole.
            pages = read_pages(pager.log.path)
            return _json(200, {"pages": [p for p in pages if not run_ids or p.get("run_id") in run_ids]})
        if path == "/api/incidents":  # open ones first, oldest first
            found = incidents(read_log(pager.log.path))
            return _json(200, {"incidents": [i for i in found if not run_ids or i["run_id"] in run_ids]})
        if path == "/-/ready" and (problem := pager.log.error or pager.log.writable()) is not None:
            # Not ready while pages cannot be stored: Alertmanager's retries keep them meanwhile.
            return Response(f"Not ready: {problem}\n".encode(errors="backslashreplace"), 503, media_type=TEXT)
        return Response(b"OK\n", 200, media_type=TEXT)

    def _index(self) -> bytes:
        """What a browser opening the pager's address reads: its routes and its runbooks."""
        folder = self.pager.runbooks
        names = sorted(p.name for p in folder.glob("*.md") if RUNBOOK_NAME.fullmatch(p.name)) if folder else []
        lines = ["runwatch pager: Alertmanager's webhook receiver and the lab's page log.", ""]
        lines += [f"  {method:4s} {route}" for route, method in ROUTES.items() if route != "/"]
        lines += ["", "Runbooks:", *(f"  {RUNBOOK_BASE}/{name}" for name in names)]
        lines += ["", "Pages: `runwatch pager` (or --follow) prints them, with their runbooks."]
        return ("\n".join(lines) + "\n").encode()

    def _runbook(self, name: str) -> Response:
        """Serve runbooks/<AlertName>.md, so dashboards and pages can link to them; a symlink
        (runbooks/X.md -> /etc/shadow) is not a runbook, whatever it points at."""
        folder = self.pager.runbooks
        path = folder / name if folder is not None and RUNBOOK_NAME.fullmatch(name) else None
        if path is None or path.is_symlink() or not path.is_file():
            return Response(f"404 no runbook {name!r}\n".encode(), 404, media_type=TEXT)
        return Response(path.read_bytes(), 200, media_type="text/markdown; charset=utf-8")

    # --- what a POST must show before its body is read ---

    def _judge(self, headers: Headers) -> None:
        """Refuse a request that is not Alertmanager's or a local client's, from its headers alone.

        A web page in the learner's browser can POST here (fetch with mode "no-cors" sends
        text/plain, and a DNS-rebinding page sends its own Host); Alertmanager and `runwatch ack`
        send JSON, to an address of the pager's, never an Origin, and the lab's token if it has one.
        """
        if not host_allowed(headers.get("host"), self.pager.hosts):
            served = ", ".join(sorted(self.pager.hosts))
            raise RefusedError(403, "foreign", "headers",
                          f"Host {headers.get('host')!r} is not the pager's (it answers as {served})")  # fmt: skip
        if "origin" in headers:
            origin = headers["origin"]
            raise RefusedError(
                403, "foreign", "headers", f"a browser's request (Origin {origin!r}); only Alertmanager posts here"
            )
        token = self.pager.token
        if token is not None and not hmac.compare_digest(
            headers.get("authorization", "").encode(), f"Bearer {token}".encode()
        ):
            problem = "missing" if "authorization" not in headers else "does not carry the lab's token"
            carried = "the lab's Alertmanager and runwatch ack carry it (STATE_DIR/pager.token)"
            raise RefusedError(401, "unauthorized", "Authorization", f"{problem}; {carried}")

    @staticmethod
    def _json_type(headers: Headers) -> None:
        # what fetch(url, {mode: "no-cors"}) sends: text/plain, a form, or none
        found = headers.get("content-type", "")
        if found.split(";")[0].strip().lower() != "application/json":
            raise RefusedError(403, "foreign", "headers", f"Content-Type must be application/json, got {found!r}")

    async def _body(self, request: Request, length: int, keep: bool = True) -> bytes:
        """The request's body (at most length bytes kept), all within body_timeout; a body still
        coming then is refused with 408."""
        got = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout):
                async for chunk in request.stream():
                    if keep or len(got) < length:
                        got += chunk
                    if not keep and len(got) >= length:
                        break
        except TimeoutError:
            raise RefusedError(408, "timeout", "body", f"did not arrive within {self.body_timeout:g} s") from None
        except ClientDisconnect:
            pass  # what came is judged: a short body is named as such
        return bytes(got)

    # --- the routes that take a body ---

    async def _webhook(self, request: Request, watchdog: bool = False) -> Response:
        """POST /webhook (pages) and /watchdog (the heartbeat): an Alertmanager v4 payload."""
        headers, pager = request.headers, self.pager
        self._judge(headers)
        header = headers.get("content-length")
        if header is None:
            raise RefusedError(411, "length_required", "Content-Length", "header is required")
        length = int(header) if header.strip().isascii() and header.strip().isdigit() else -1
        if length < 0:
            raise RefusedError(400, "malformed", "Content-Length", f"must be a byte count, got {header!r}")
        self._json_type(headers)
        if length > pager.max_body:
            # Read and drop the body, so the client is not reset before it reads the 413.
            await self._body(request, min(length, DRAIN_LIMIT), keep=False)
            raise RefusedError(413, "too_large", "body", f"{length} bytes exceeds the limit of {pager.max_body}")
        body = await self._body(request, length)
        return await self._blocking(self._take, body, length, watchdog)

    def _take(self, body: bytes, length: int, watchdog: bool) -> Response:
        """Store a webhook's pages (or hear its heartbeat), in a worker thread."""
        pager = self.pager
        try:
            alerts = _payload(body, length)
        except PayloadError as e:
            return self._refused(RefusedError(400, "malformed", e.field, str(e).split(": ", 1)[1]))
        now = pager.clock()
        if watchdog:
            # A firing Watchdog is the heartbeat; a resolved one means Prometheus stopped sending it.
            records = []
            if any(a["status"] == "firing" for a in alerts):
                pager.metrics.watchdog.set(now)
                records = [r for r in [pager.watchdog.beat(now)] if r is not None]
        else:
            rules = rules_in_force(pager.prometheus) if alerts else {}
            records = [page_record(a, rfc3339_ms(now), rules.get(a["labels"].get("alertname", ""))) for a in alerts]
            for record, a in zip(records, alerts, strict=True):
                if record["status"] == "resolved" and record["rule"] and page_key(record) not in pager.log.seen:
                    record["value_at_resolution"] = value_at_resolution(pager.prometheus, record["rule"], a)
        try:
            stored, duplicates = pager.record_pages(records, now)
        except OSError as e:
            return self._refused(
                RefusedError(500, "write_failed", "page log", f"cannot append to {pager.log.path}: {e}")
            )
        pager.metrics.notifications.inc()
        return _json(200, {"stored": len(stored), "duplicates": duplicates})

    def _refused(self, refused: RefusedError) -> Response:
        self.pager.metrics.rejected.labels(refused.reason).inc()
        return _json(refused.status, {"error": str(refused), "field": refused.field}, {"Connection": "close"})

    async def _ack(self, request: Request) -> Response:
        """POST /api/ack {alert, run_id, comment, by, ack_id[, silence]}: acknowledge an open incident.

        200 with the incident; 409 if it has not paged or is already acknowledged; 400 on a bad
        field; 403 from a web page (as the webhook: its Host, an Origin, a body that is not JSON);
        401 without the lab's token, as a webhook.
        """
        headers = request.headers
        self._judge(headers)
        self._json_type(headers)
        header = headers.get("content-length", "")
        length = int(header) if header.strip().isdigit() else -1
        if length < 0 or length > self.pager.max_body:
            limit = self.pager.max_body
            raise RefusedError(400, "malformed", "Content-Length", f"must be a byte count up to {limit}")
        body = await self._body(request, length)
        return await self._blocking(self._acknowledge, body)

    def _acknowledge(self, body: bytes) -> Response:
        pager = self.pager
        try:
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):
                raise PayloadError("body", "is not a JSON object") from None
            record = ack_record(parsed, rfc3339_ms(pager.clock()))
        except PayloadError as e:
            return self._refused(RefusedError(400, "malformed", e.field, str(e).split(": ", 1)[1]))
        try:
            incident, why = pager.log.acknowledge(record)
        except OSError as e:
            return self._refused(
                RefusedError(500, "write_failed", "page log", f"cannot append to {pager.log.path}: {e}")
            )
        if incident is None:
            return _json(409, {"error": why, "field": "alert"})
        return _json(200, {"incident": incident})


def _payload(body: bytes, length: int) -> list[dict[str, Any]]:
    """A webhook body's alerts, checked whole; PayloadError on the first bad part."""
    if len(body) != length:
        raise PayloadError("body", f"got {len(body)} of the {length} bytes in Content-Length")
    try:
        payload = json.loads(body)
    except ValueError as e:
        raise PayloadError("body", f"is not valid UTF-8 JSON ({e})") from None
    except RecursionError:
        raise PayloadError("body", "is nested too deeply to be an Alertmanager payload") from None
    return validate_payload(payload)

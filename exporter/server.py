"""Serve a registry's /metrics over HTTP, reporting how long each render took.

Use `start(registry, port)`; it returns the running server (call `.shutdown()` to stop).
Not for anything but loopback in this lab: there is no authentication.

    >>> srv = start(CollectorRegistry(), port=0)   # port 0: any free port
    >>> srv.server_address[1] > 0
    True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from runwatch.core.names import LOOPBACK

SCRAPE_DURATION = "runwatch_exporter_scrape_duration_seconds"


class PortInUseError(OSError):
    """The port is taken; the message names it."""


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?")[0] == "/metrics":
            body = self.server.render()
            self._reply(200, CONTENT_TYPE_LATEST, body)
            if self.headers.get("User-Agent", "").startswith("Prometheus/"):
                self.server.last_scraped = time.monotonic()
                self.server.scraped.set()
        elif self.path in ("/-/healthy", "/-/ready"):
            self._reply(200, "text/plain", b"OK\n")
        elif self.path == "/":
            self._reply(200, "text/html", b'<html><body><a href="/metrics">/metrics</a></body></html>\n')
        else:
            self._reply(404, "text/plain", b"not found\n")

    def _reply(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes every second: stay quiet
        pass


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, clock: Callable[[], float] = time.perf_counter
    ):
        self.registry, self._clock = registry, clock
        self._scrape = Gauge(
            SCRAPE_DURATION,
            "Seconds the exporter took to render the previous /metrics response.",
            registry=registry,
        )
        self._lock = threading.Lock()
        # Set once Prometheus itself (not a curl, not a healthcheck) has scraped /metrics, and
        # when it last did (time.monotonic()): the live trainer holds its clock while nobody watches.
        self.scraped = threading.Event()
        self.last_scraped: float | None = None
        try:
            super().__init__((host, port), _Handler)
        except OSError as err:
            if err.errno == 98:  # EADDRINUSE
                raise PortInUseError(f"port {port} is already in use") from err
            raise

    def render(self) -> bytes:
        with self._lock:
            t0 = self._clock()
            body = generate_latest(self.registry)
            self._scrape.set(self._clock() - t0)
        return body


def start(
    registry: CollectorRegistry, port: int, host: str = LOOPBACK, clock: Callable[[], float] = time.perf_counter
) -> MetricsServer:
    """Serve registry on host:port in a daemon thread; raise PortInUseError if the port is taken."""
    srv = MetricsServer(registry, host, port, clock)
    threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return srv

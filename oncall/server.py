"""The pager served: its app (oncall/app.py) on uvicorn, the console's stack, with the same bounds
against slow clients (runwatch.core.serving), and its watchdog's thread.

Bounded as a production server is (issues 28 and 40): a connection has HEAD_TIMEOUT_S to send a
whole request head and, once its headers are judged, as long for its body; at most MAX_WAITING
wait for their next request (then the oldest that never sent one is closed); past
LIMIT_CONCURRENCY connections a request is answered 503 at once. Waiting costs no thread; what
blocks (the fsynced log) runs on the app's WORKERS threads. Measured under slow connections by
benchmarks/bench_slow_connections.py.

    >>> server = make_server("127.0.0.1", 0, Path(".runwatch/pages.jsonl"), registry=CollectorRegistry())
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from runwatch.core.addresses import served_hosts
from runwatch.core.serving import bounded_h11
from runwatch.oncall.app import Pager, PagerApp
from runwatch.oncall.metrics import PagerMetrics
from runwatch.oncall.page_log import PageLog
from runwatch.oncall.watchdog import WATCHDOG_TIMEOUT_S

HEAD_TIMEOUT_S = 10.0  # for a request's line and headers to arrive, and then for its whole body
MAX_WAITING = 1024  # connections waiting for a request at once; past it the oldest that never sent one is closed
IDLE_TIMEOUT_S = 300  # a kept-alive connection between requests: Alertmanager keeps one 5 minutes
LIMIT_CONCURRENCY = MAX_WAITING + 256
BACKLOG = 128
MAX_HEAD_BYTES = 64 << 10
# On SIGTERM a request in flight finishes within this, inside compose's 10 s before SIGKILL.
SHUTDOWN_GRACE_S = 3


class PagerServer:
    """The pager's app on a bound socket: serve_forever() runs it (in any thread) until shutdown().

    Keep-alive, as Alertmanager's HTTP client expects: a notification then goes over an open
    connection and needs no DNS lookup of `pager`. Measured under Podman, whose DNS drops
    lookups for seconds after any container starts or stops: with a new connection (and a
    lookup) per notification, a TrainerDown page came 28-52 s late instead of ~12 s.
    """

    def __init__(self, host: str, port: int, pager: Pager, head_timeout: float = HEAD_TIMEOUT_S,
                 max_waiting: int = MAX_WAITING) -> None:  # fmt: skip
        import uvicorn  # here: `pager-serve --help` and its usage errors need none of the web stack

        self.pager = pager
        self.protocol = _judged_h11(head_timeout, max_waiting, pager.metrics)
        config = uvicorn.Config(
            PagerApp(pager, body_timeout=head_timeout), log_level="warning", access_log=False, lifespan="off",
            proxy_headers=False, server_header=False, limit_concurrency=LIMIT_CONCURRENCY, backlog=BACKLOG,
            timeout_keep_alive=IDLE_TIMEOUT_S, timeout_graceful_shutdown=SHUTDOWN_GRACE_S, http=self.protocol,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES, ws="none",
        )  # fmt: skip
        # Every import the server needs, before the port answers: a SIGTERM (KeyboardInterrupt, as
        # pager-serve has it) that lands in an import's exec of generated code (a dataclass's) makes
        # Python end itself with SIGINT at exit, whatever main returns. Measured: 1 stop in 5 did.
        config.load()
        config.get_loop_factory()
        # IPPROTO_TCP named, as the console does: asyncio sets TCP_NODELAY only on sockets that say they are TCP.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
            self.socket.listen(BACKLOG)  # connections queue from here, before serve_forever runs
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self.uvicorn = uvicorn.Server(config)
        self.stopped = threading.Event()  # ends the watchdog's thread
        self._serving, self._served = threading.Event(), threading.Event()

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        """Serve until shutdown() (or, in the main thread, SIGINT or SIGTERM). poll_interval is
        socketserver's, and unused: uvicorn looks for shutdown every 0.1 s."""
        self._serving.set()
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self._served.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has returned (as socketserver's shutdown does)."""
        self.uvicorn.should_exit = True
        if self._serving.is_set():
            self._served.wait()

    def stop(self) -> None:
        """Ask serve_forever to stop, without waiting (safe in a signal handler, whatever runs)."""
        self.uvicorn.should_exit = True

    def server_close(self) -> None:
        self.stopped.set()
        self.socket.close()

    def watch(self, stop: threading.Event, every: float = 1.0) -> None:
        """The watchdog's check (Pager.watch), run in a thread until stop is set."""
        self.pager.watch(stop, every)


def _judged_h11(head_timeout: float, max_waiting: int, metrics: PagerMetrics) -> type:
    """The bounded protocol, whose refusal of a request h11 cannot parse (a Content-Length that is
    no byte count) is the pager's one-line JSON naming the field, counted as malformed."""
    import h11

    class Judged(h11.Connection):
        refusal = ""  # what h11 found wrong with the request

        def next_event(self) -> Any:
            try:
                return super().next_event()
            except h11.RemoteProtocolError as err:
                self.refusal = str(err)
                raise

    class PagerH11(bounded_h11(head_timeout, max_waiting)):
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            self.conn = Judged(h11.SERVER, config.h11_max_incomplete_event_size)

        def send_400_response(self, msg: str) -> None:
            problem = self.conn.refusal or msg
            field = "Content-Length" if "content-length" in problem.lower() else "request"
            said = f"must be a byte count ({problem})" if field == "Content-Length" else f"is not HTTP/1.1 ({problem})"
            metrics.rejected.labels("malformed").inc()
            body = json.dumps({"error": f"{field}: {said}", "field": field}).encode() + b"\n"
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]  # fmt: skip
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):  # fmt: skip
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return PagerH11


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
    head_timeout: float = HEAD_TIMEOUT_S,
    max_waiting: int = MAX_WAITING,
) -> PagerServer:
    """Load the page log and bind the pager to host:port (0 picks a free port); call serve_forever() to run it.

    Do not use this for a quick look at pages; read_pages() reads the log without a server.

        >>> server = make_server("127.0.0.1", 0, Path(".runwatch/pages.jsonl"), registry=CollectorRegistry())
        >>> server.server_address[1] > 0
        True
    """
    registry = CollectorRegistry() if registry is None else registry
    log = PageLog(log_path)
    pager = Pager(log, PagerMetrics(registry), max_body=max_body, clock=clock, runbooks=runbooks,
                  prometheus=prometheus, token=token, watchdog_timeout=watchdog_timeout)  # fmt: skip
    server = PagerServer(host, port, pager, head_timeout, max_waiting)
    pager.hosts = served_hosts(host, server.server_address[1], allow_hosts)  # e.g. compose's `pager`
    threading.Thread(target=server.watch, args=(server.stopped,), name="watchdog", daemon=True).start()
    return server

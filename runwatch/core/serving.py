"""The one server stack of the lab's own web servers (the console and the pager): uvicorn's h11
protocol, bounded against slow clients as a production server is.

uvicorn bounds what a connection costs once its request has come (an asyncio task, no thread),
but not how long a client may take to send the request's head, nor how many may be doing so at
once. This adds both (issue 28: 8,000 half-open connections gave the old pager 6,800 threads):

- a connection has `head_timeout` seconds to send a whole request head, from its first byte;
- at most `max_waiting` connections wait for their next request at once: past it the oldest
  that has never sent a whole request is closed (else the oldest idle one), so a client that
  sends its request at once, as Alertmanager and a probe do, is served however many stall.

Do not use this for the body of a request: the application reads that, and bounds it itself
(the pager's webhook gives a whole body `head_timeout` too, after its token is checked).

    >>> config = uvicorn.Config(app, http=bounded_h11(10.0, 1024), timeout_keep_alive=5)
"""

from __future__ import annotations

from typing import Any


def bounded_h11(head_timeout: float, max_waiting: int) -> type:
    """uvicorn's H11Protocol with a deadline for each request head and a cap on the connections
    waiting for one (one class per server: its cap is that server's). uvicorn is imported here,
    so a command that serves nothing (`--help`, a usage error) loads none of the web stack."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting: dict[Any, list] = {}  # protocol -> [its head deadline's timer or None, served before], oldest first

    class BoundedH11(H11Protocol):
        room = waiting  # this server's connections waiting for a request (a test reads how many)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._wait(served=False)

        def _wait(self, served: bool) -> None:
            """Wait for a request head: at once for a new connection, from its first byte for an
            idle kept-alive one (uvicorn's keep-alive timeout bounds its silence)."""
            timer = None if served else self.loop.call_later(head_timeout, self._late)
            self._cycle_waited = self.cycle  # the request this connection waits after, if any
            waiting[self] = [timer, served]
            if len(waiting) > max_waiting:
                fresh = (p for p, (_, was_served) in waiting.items() if not was_served)
                (next(fresh, None) or next(iter(waiting)))._late()

        def _late(self) -> None:
            self._headed()
            if not self.transport.is_closing():
                self.transport.close()

        def _headed(self) -> None:
            entry = waiting.pop(self, None)
            if entry is not None and entry[0] is not None:
                entry[0].cancel()

        def data_received(self, data: bytes) -> None:
            entry = waiting.get(self)
            if entry is not None and entry[0] is None:  # an idle connection's next head has begun
                entry[0] = self.loop.call_later(head_timeout, self._late)
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not getattr(self, "_cycle_waited", None):
                self._headed()  # a whole request head has come

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():  # kept alive: it waits for its next request
                self._wait(served=True)
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headed()
            super().connection_lost(exc)

    return BoundedH11

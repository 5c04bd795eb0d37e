"""uvicorn's configuration for Merlin's server, with the connection limits uvicorn lacks.

uvicorn closes a keep-alive connection idle after a response, but a connection that never
sends a request, or sends its headers a byte at a time, stays open for ever, and every open
connection holds a file descriptor: enough of them (about a thousand with the usual limit)
lock every client out before any API key is checked, and asyncio then logs each refused
accept (96 MB of log in 16 s, measured). GuardedH11 adds two limits to uvicorn's h11
protocol:

  - at most MAX_CONNECTIONS open connections: one past it is closed as it arrives;
  - a request's headers must be complete HEADER_TIMEOUT_S after the connection opens or the
    previous response ends, or the connection is closed.

The body's own deadline is the app's (app.py, BODY_TIMEOUT_S), which answers 408.

Subclassing uvicorn's protocol rather than writing one: h11 parsing, flow control, keep-alive
and the ASGI cycle stay uvicorn's; only connection_made, data_received and
on_response_complete are extended.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 128  # a queue of 8 requests, their streams, health checks: plenty
HEADER_TIMEOUT_S = 10.0


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a deadline for request headers."""

    _deadline = None
    _waiting_cycle = None  # the request cycle current when the deadline was set

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._waiting_cycle:
            self._deadline.cancel()  # a request's headers arrived
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_cycle = self.cycle
        self._deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._too_slow)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.cycle is self._waiting_cycle and not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app, access_log: bool = False):
    """The uvicorn.Config both `merlin-cli serve` and the app's embedded server run."""
    import uvicorn

    return uvicorn.Config(
        app, log_level="warning", access_log=access_log, lifespan="on", http=GuardedH11
    )

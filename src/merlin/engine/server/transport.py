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

and answers a request h11 cannot take (headers past MAX_HEADER_BYTES: 431; malformed: 400)
with an OpenAI-style JSON error, then reads and drops what the client still sends for up to
LINGER_S before closing: uvicorn closed at once, and a connection closed with bytes unread is
reset by the kernel, so the client saw "connection reset" instead of the answer.

The body's own deadline is the app's (app.py, BODY_TIMEOUT_S), which answers 408.

Subclassing uvicorn's protocol rather than writing one: h11 parsing, flow control, keep-alive
and the ASGI cycle stay uvicorn's; only connection_made, data_received,
on_response_complete and send_400_response are extended.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import ApiError

MAX_CONNECTIONS = 128  # a queue of 8 requests, their streams, health checks: plenty
HEADER_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 64 * 1024  # a request line and headers (h11's own default: 16 KB)
LINGER_S = 2.0  # after an error answer, how long the client's further bytes are read


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a deadline for request headers."""

    _deadline = None
    _waiting_cycle = None  # the request cycle current when the deadline was set
    _lingering = False  # an error was answered: what comes is dropped until the close
    _refusal = None  # h11's error for the request uvicorn is answering with a 400

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._keep_refusals()
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._waiting_cycle:
            self._deadline.cancel()  # a request's headers arrived
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._lingering:  # (a pipelined bad request was answered: closing already)
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

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refused: a JSON error saying why (431 for
        headers past MAX_HEADER_BYTES), then a lingering close."""
        if getattr(self._refusal, "error_status_hint", 400) == 431:
            error = ApiError(
                f"The request's headers are over {MAX_HEADER_BYTES // 1024} KB; send them "
                "shorter (a long cookie or a key pasted twice?).",
                status=431,
            )
        else:
            error = ApiError(f"The request is not valid HTTP/1.1: {msg}", status=400)
        body = json.dumps(error.body()).encode()
        reason = HTTPStatus(error.status).phrase.encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        try:
            for event in (
                h11.Response(status_code=error.status, headers=headers, reason=reason),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response had begun: nothing more can be said
            self.transport.close()
            return
        self._linger()

    def _keep_refusals(self) -> None:
        """uvicorn answers h11's RemoteProtocolError with a 400 and drops the error, whose
        status hint (431: headers too large) says what to tell the client: keep it."""
        next_event = self.conn.next_event

        def remembering():
            try:
                return next_event()
            except h11.RemoteProtocolError as e:
                self._refusal = e
                raise

        self.conn.next_event = remembering

    def _linger(self) -> None:
        """Stop answering, drop what arrives, close when the client does or after LINGER_S."""
        self._lingering = True
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(LINGER_S, self.transport.close)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the answer, then its end

    def eof_received(self):
        if self._lingering:
            self.transport.close()
            return None
        return super().eof_received()

    def _too_slow(self) -> None:
        self._deadline = None
        if self.cycle is self._waiting_cycle and not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app, access_log: bool = False):
    """The uvicorn.Config both `merlin-cli serve` and the app's embedded server run."""
    import uvicorn

    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=access_log,
        lifespan="on",
        http=GuardedH11,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )


def uvicorn_server(app, access_log: bool = False):
    """A uvicorn.Server for `app` (uvicorn_config) whose shutdown signal (Ctrl-C, SIGTERM)
    first ends the answers in progress and in line (app.state.queue.cancel_all): their
    clients get an error at once, where uvicorn's graceful shutdown waited for every one."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            queue = getattr(app.state, "queue", None)
            if queue is not None:
                queue.cancel_all()
            super().handle_exit(sig, frame)

    return Server(uvicorn_config(app, access_log=access_log))

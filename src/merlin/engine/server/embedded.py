"""The OpenAI API served from inside another program that has the model loaded (the app).

`EmbeddedServer.start(model, ...)` binds the socket (a port in use is an immediate
MerlinError), then runs the same Starlette app as `merlin-cli serve` under uvicorn on a
thread of its own with its own event loop, and returns once it accepts connections.
`stop()` asks uvicorn to finish (open streams are cancelled at their next step) and joins the
thread; the port is free afterwards.

The model is shared: requests compute while holding `engine_lock`, which the host program
also holds while it computes, so the two never run forwards at the same time (they would
share the model's scratch buffers and the cores). The same security policy as the CLI
applies: loopback by default; any other address requires an API key (one is generated when
none is given, and returned in `api_key`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass

from ..errors import MerlinError
from .cli import api_key_for, bind, is_loopback

START_TIMEOUT_S = 30.0


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    context: int = 8192
    model_name: str | None = None


def lan_address() -> str | None:
    """This computer's address on its network (the interface of the default route: a UDP
    socket "connected" to a documentation address sends nothing), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            return probe.getsockname()[0]
        except OSError:
            return None


class EmbeddedServer:
    def __init__(self, server, thread: threading.Thread, url: str, api_key: str | None):
        self._server = server
        self._thread = thread
        self.url = url  # http://HOST:PORT/v1
        self.api_key = api_key

    @classmethod
    def start(cls, model, options: ServeOptions, engine_lock) -> EmbeddedServer:
        try:
            import uvicorn

            from .app import ServerConfig, create_app
            from .transport import uvicorn_config
        except ImportError as e:
            raise MerlinError(
                f"serving the API needs the server extra ({e.name} is missing): "
                "pip install 'merlin[server]'."
            ) from None
        from .engine_adapter import EngineAdapter

        if not 0 <= int(options.port) <= 65535:
            raise MerlinError(f"port {options.port} is not a port number; use 1..65535.")
        key, _ = api_key_for(options.host, options.api_key)
        sock = bind(options.host, int(options.port), "choose another port")
        name = options.model_name or model.name
        config = ServerConfig(
            model_name=name,
            api_key=key,
            engine_lock=engine_lock,
            loopback_only=is_loopback(sock.getsockname()[0]),
        )
        app = create_app(model, config, EngineAdapter(model, context_budget=options.context))
        server = uvicorn.Server(uvicorn_config(app))
        failed: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except BaseException as e:  # reported to start() if it happens before it returns
                failed.append(e)
            finally:
                sock.close()

        thread = threading.Thread(target=run, name="merlin-api-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not server.started:
            server.should_exit = True
            thread.join(5)
            why = f" ({failed[0]})" if failed else ""
            raise MerlinError(f"the API server did not start{why}.")
        host, port = sock.getsockname()[:2]
        if host in ("0.0.0.0", "::"):  # every interface: the address other devices use
            host = lan_address() or socket.gethostname()
        shown = f"[{host}]" if ":" in host else host
        return cls(server, thread, f"http://{shown}:{port}/v1", key)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: answers in progress or waiting end now, as errors to their clients
        (a cut answer had been sent on, then ended as if finished)."""
        self._server.config.app.state.queue.cancel_all()
        self._server.should_exit = True
        self._thread.join(timeout)

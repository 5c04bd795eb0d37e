"""`merlin-cli serve`: load a model, warm it up, serve the OpenAI API with uvicorn.

Security defaults: 127.0.0.1; listening anywhere else without an API key generates one and
prints it (the key may also come from MERLIN_API_KEY, which keeps it out of the process
list). The socket is bound here, before uvicorn starts, so a port in use is a one-line error
and `--port 0` picks a free port; the line `merlin-cli serve: listening on URL` is printed
(and flushed) once the server accepts connections.

Starlette and uvicorn are the optional extra `merlin[server]`; without them the command says
how to install them. They are imported only here and in engine.server.app.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
import sys

from .. import limits
from ..errors import MerlinError
from ..speculative import MAX_K, SPEC_MODES

LOOPBACK_NAMES = ("localhost",)
MAX_PORT = 65535
MAX_SESSIONS = 1024  # each keeps a KV cache
MAX_QUEUE = 1 << 16
MB_RANGE = (0.001, 4096.0)  # --max-body-mb and --max-image-mb: 1 KB to 4 GB


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..commands.args import add_model_args

    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free port)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: $MERLIN_API_KEY; generated and "
        "printed when listening beyond this machine without one)",
    )
    p.add_argument(
        "--model-name",
        default=None,
        help="model id in /v1/models (default: the checkpoint's name, Model.name)",
    )
    p.add_argument(
        "--allow-images",
        default=None,
        metavar="DIR",
        help="image file paths in requests may point inside DIR (default: data: URLs only)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from ORIGIN (repeatable; default: no CORS headers)",
    )
    p.add_argument(
        "--context", type=int, default=8192, help="context budget in tokens (0: the model's)"
    )
    p.add_argument("--sessions", type=int, default=2, help="conversations kept with their KV cache")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait (then 429)")
    p.add_argument("--max-pixels", type=int, default=None, help="pixel budget per image")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body")
    p.add_argument("--max-image-mb", type=float, default=20.0, help="largest image")
    p.add_argument("--spec", default="auto", help=f"speculative decoding: {'|'.join(SPEC_MODES)}")
    p.add_argument("--spec-k", type=int, default=4, help=f"drafts per verify, 1..{MAX_K}")
    p.add_argument("--no-warm-up", action="store_true", help="do not compile kernels at start")
    p.add_argument("--log-requests", action="store_true", help="uvicorn's access log")


def check_options(args) -> None:
    """InputError naming the option and its range when a number of serve's is impossible, so
    it ends in one line at startup, not in a server that refuses every request (--max-body-mb
    -1), serves another context than asked (--context -5) or a traceback (--port 70000).
    --max-pixels and --threads are bounded by merlin-cli's own checks (engine.cli_checks),
    as for every subcommand (--threads 0: one a CPU)."""
    limits.integer(args.port, "--port", 0, MAX_PORT)
    limits.context_tokens(args.context, "--context")
    limits.integer(args.sessions, "--sessions", 1, MAX_SESSIONS)
    limits.integer(args.queue, "--queue", 0, MAX_QUEUE)
    limits.number(args.max_body_mb, "--max-body-mb", *MB_RANGE)
    limits.number(args.max_image_mb, "--max-image-mb", *MB_RANGE)
    limits.integer(args.spec_k, "--spec-k", 1, MAX_K)  # else every answer carried the notice


def unbracketed(host: str) -> str:
    """[::1] (how IPv6 hosts are written in URLs) as ::1."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    host = unbracketed(host)
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_for(host: str, key: str | None) -> tuple[str | None, bool]:
    """The key the server requires, and whether it was generated: listening beyond loopback
    (e.g. 0.0.0.0) never goes without one."""
    if key:
        if not (key.isascii() and key.isprintable()):  # clients could not send it
            raise MerlinError(
                "the API key must be printable ASCII letters, digits and signs (an HTTP header "
                "carries no other); choose another."
            )
        return key, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(24), True


def bind(host: str, port: int, advice: str = "choose another --port or --host") -> socket.socket:
    host = unbracketed(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it Nagle + delayed ACKs hold a streamed token back ~40 ms
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise MerlinError(f"cannot listen on {host}:{port} ({e.strerror}); {advice}.") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def warm_up(model) -> None:
    """One tiny answer through every decode kernel, so the first request does not compile."""
    from ..generate import AnswerOptions, generate
    from ..prompt import text_prompt
    from ..sampling import SamplingParams

    prompt = text_prompt(model.tokenizer.encode_text("Hello"))
    options = AnswerOptions(sampling=SamplingParams(temperature=0.0), max_new_tokens=2,
                            ignore_eos=True)  # fmt: skip
    for _ in generate(model, prompt, options, max_context=64):
        pass


def run(args) -> int:
    check_options(args)
    try:
        import uvicorn  # noqa: F401 (a missing server extra is said here)

        from .app import ServerConfig, create_app
        from .transport import uvicorn_server
    except ImportError as e:
        raise MerlinError(
            f"merlin-cli serve needs the server extra ({e.name} is missing): "
            "pip install 'merlin[server]'."
        ) from None
    from ..commands.args import load as _load
    from .engine_adapter import EngineAdapter
    from .schema import Limits

    if args.spec not in SPEC_MODES:
        raise MerlinError(f"--spec must be one of {', '.join(SPEC_MODES)}.")
    if args.allow_images and not os.path.isdir(os.path.expanduser(args.allow_images)):
        raise MerlinError(f"--allow-images {args.allow_images}: no such folder.")
    key, generated = api_key_for(args.host, args.api_key or os.environ.get("MERLIN_API_KEY"))
    sock = bind(args.host, args.port)  # before the key is shown: an address that fails has none
    if generated:
        print(
            f"merlin-cli serve: listening on {args.host} needs an API key; generated one:\n"
            f"  {key}\nClients send it as 'Authorization: Bearer {key}'.",
            file=sys.stderr,
        )
    model = _load(args)
    if not args.no_warm_up:
        warm_up(model)
    name = args.model_name or model.name
    mb = 1024 * 1024
    config = ServerConfig(
        model_name=name,
        api_key=key,
        limits=Limits(
            max_body_bytes=int(args.max_body_mb * mb), max_image_bytes=int(args.max_image_mb * mb)
        ),
        allowed_images=args.allow_images,
        cors_origins=args.cors_origin,
        max_waiting=args.queue,
        loopback_only=is_loopback(sock.getsockname()[0]),
    )
    adapter = EngineAdapter(
        model,
        context_budget=args.context,
        sessions=args.sessions,
        max_pixels=args.max_pixels,
        spec=args.spec,
        spec_k=args.spec_k,
    )
    app = create_app(model, config, adapter)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn_server(app, access_log=args.log_requests)

    async def started():  # printed once uvicorn accepts connections
        while not server.started:
            await asyncio.sleep(0.02)
        print(f"merlin-cli serve: listening on http://{shown}:{port}/v1 (model {name})", flush=True)

    import asyncio

    async def main():
        task = asyncio.create_task(started())
        await server.serve(sockets=[sock])
        task.cancel()

    asyncio.run(main())
    return 0

"""`merlin-cli serve`: the OpenAI-compatible chat-completions server (merlin.engine.server)."""

from __future__ import annotations


def register(sub) -> None:
    from ..server import cli as serve

    p = sub.add_parser("serve", help="serve the OpenAI chat-completions API (merlin[server])")
    serve.add_arguments(p)
    p.set_defaults(func=serve.run)

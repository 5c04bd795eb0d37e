"""merlin-cli warmup: compile the kernels ahead of time (engine.warmup does the work)."""

from __future__ import annotations


def register(sub) -> None:
    from .. import warmup

    p = sub.add_parser(
        "warmup", help="compile the kernels for the given formats ahead of time, with progress"
    )
    warmup.add_arguments(p)
    p.set_defaults(func=warmup.run)

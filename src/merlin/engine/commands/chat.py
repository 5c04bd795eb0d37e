"""merlin-cli chat: a conversation on standard input, one user turn per line.

Lines: `/image PATH` attaches an image to the next turn; `/regenerate` answers the last
question again; any other non-empty line is a user turn, answered as it streams. With
`--session FILE` the conversation is restored from FILE when the file matches the model
(otherwise its messages are recomputed, or a new chat starts) and saved after every turn, so
the next run continues where this one stopped. Problems with one turn (an unreadable image, a
question that does not fit) are reported on stderr and the chat goes on; the exit status is 2
if any turn failed.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ..errors import MerlinError
from .args import (
    EXIT_USER_ERROR,
    ReasoningPrinter,
    add_generation_args,
    add_model_args,
    answer_options,
    format_profile,
    load,
    thinking_kwargs,
)
from .args import emit as _emit
from .args import note as _note


def register(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="a conversation: user turns from stdin, one per line ('/image PATH' on its own "
        "line attaches an image to the next turn); --session FILE continues it across runs",
    )
    add_model_args(p)
    add_generation_args(p)
    p.add_argument(
        "--session",
        default=None,
        metavar="FILE",
        help="restore the conversation from FILE if it matches the model; save after each turn",
    )
    p.set_defaults(func=cmd_chat)


def cmd_chat(args) -> int:
    from ..session import Session, SessionSettings
    from ..speculative import SpecPolicy

    # restore and save problems are reported below, once, in the CLI's own words
    logging.getLogger("merlin.engine.session").setLevel(logging.ERROR)
    if args.session:  # never replace a file that is not one of our sessions (before any work)
        from ..session_check import check_target

        check_target(Path(args.session).expanduser())
    model = load(args)
    options = answer_options(args, model)
    thinking_kwargs(args, model)  # --thinking on without support: an error before any turn
    _, notice = SpecPolicy.or_off(args.spec, args.spec_k)
    if notice:
        _note(f"warning: {notice}")
    settings = SessionSettings(
        context_budget=args.max_context or 0,
        max_pixels=args.max_pixels,
        image_tokens=args.image_tokens,
    )
    out = sys.stdout
    path = Path(args.session).expanduser() if args.session else None
    if path is not None and path.exists():
        session, result = Session.open(model, path, settings, system=args.system)
        if result.restored:
            _note(
                f"restored {path} ({result.tokens} tokens, {len(session.messages)} messages, "
                f"{result.ms:.0f} ms)"
            )
        else:
            kept = " its messages are recomputed;" if result.messages_loaded else ""
            _note(f"warning: session {path} not restored ({result.reason});{kept} continuing")
        if args.json:
            _emit(
                out,
                {
                    "event": "session",
                    "restored": result.restored,
                    "reason": result.reason,
                    "tokens": result.tokens,
                    "messages": len(session.messages),
                },
            )
    else:
        session = Session(model, system=args.system or "", settings=settings)
    pending = list(args.image)
    failed = False
    for raw in sys.stdin:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if line.startswith("/image"):
            image = line[len("/image") :].strip()
            if not image:
                _note("error: /image needs a file path.")
                failed = True
            else:
                pending.append(image)
            continue
        try:
            if line.strip() == "/regenerate":
                events = session.regenerate(options)
            else:
                events = session.ask(line, pending, options)
            pending = []
            interrupted = _stream(events, args, out)
        except MerlinError as e:
            _note(f"error: {e}")
            pending = []
            failed = True
            continue
        if path is not None:
            _save(session, path, args, out)
        if interrupted:
            _note("interrupted")
            return 130
    return EXIT_USER_ERROR if failed else 0


def _stream(events, args, out) -> bool:
    """Print one answer's events; returns True if Ctrl-C stopped it (the partial answer is
    kept in the session)."""
    from ..generate import Finished, Tokens, event_json
    from ..session import ContextTrimmed

    shown = ReasoningPrinter()
    try:
        for event in events:
            if args.profile and isinstance(event, Tokens) and event.ids:
                print(format_profile(event.profile), file=sys.stderr)
            if isinstance(event, ContextTrimmed):
                if args.json:
                    _emit(
                        out,
                        {
                            "event": "notice",
                            "text": event.notice,
                            "dropped": event.dropped,
                            "dropped_tokens": event.dropped_tokens,
                        },
                    )
                else:
                    _note(f"notice: {event.notice}")
            elif args.json:
                obj = event_json(event)
                _emit(out, obj)
            elif isinstance(event, Tokens):
                shown.tokens(event, out)
            elif isinstance(event, Finished):
                shown.end()
                out.write("\n")
                out.flush()
                e = event
                vision = f"vision {e.vision_ms:.0f} ms, " if e.vision_ms else ""
                print(
                    f"[{e.reason}: {e.generated_tokens} tokens, {vision}"
                    f"prefill {e.prompt_tokens} new + {e.reused_tokens} reused tokens "
                    f"in {e.prefill_ms:.0f} ms, {e.tokens_per_s:.1f} tok/s]",
                    file=sys.stderr,
                )
    except KeyboardInterrupt:
        events.close()
        if not args.json:
            out.write("\n")
        return True
    return False


def _save(session, path: Path, args, out) -> None:
    from ..arrayfile import FileSaveError

    try:
        size = session.save(path)
    except FileSaveError as e:
        _note(f"warning: the session was not saved: {e}. The conversation goes on in memory.")
        return
    if args.json:
        _emit(out, {"event": "saved", "path": str(path), "bytes": size})

"""merlin-cli chat: a conversation on standard input, one user turn per line.

Lines: `/image PATH` attaches an image to the next turn; `/regenerate` answers the last
question again; any other non-empty line is a user turn, answered as it streams. With
`--session FILE` the conversation is restored from FILE when the file matches the model
(otherwise its messages are recomputed, or a new chat starts) and saved after every turn, so
the next run continues where this one stopped. A session file that changed since this run
loaded or last saved it (another run saved its own turn there) is never overwritten: this
run's conversation goes to a new file beside it (`c (2).mss`), named on stderr. Problems with
one turn (an unreadable image, a question that does not fit) are reported on stderr and the
chat goes on; the exit status is 2 if any turn failed.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlparse

from ..errors import InputError, MerlinError
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

        check_target(Path(os.path.expanduser(args.session)))
    model = load(args)
    options = answer_options(args, model)
    thinking_kwargs(args, model)  # --thinking on without support: an error before any turn
    _, notice = SpecPolicy.or_off(args.spec, args.spec_k)
    if notice:
        _note(f"warning: {notice}")
    settings = SessionSettings(
        context_budget=args.max_context or model.default_context,
        max_pixels=args.max_pixels,
        image_tokens=args.image_tokens,
    )
    out = sys.stdout
    path = Path(os.path.expanduser(args.session)) if args.session else None
    target = _SessionFile(path) if path is not None else None  # before the file is read
    if path is not None and path.exists():
        session, result = Session.open(model, path, settings, system=args.system)
        if not result.messages_loaded and path.exists():  # its conversation cannot be read:
            raise InputError(  # saving after the first turn would replace it
                f"--session {path}: its conversation cannot be read ({result.reason}); the "
                "file was not changed. Give another path (a new file) for this conversation, "
                "or move that file away."
            )
        target.opened()
        if result.restored:
            _note(
                f"restored {path} ({result.tokens} tokens, {len(session.messages)} messages, "
                f"{result.ms:.0f} ms)"
            )
        else:
            kept = " its messages are recomputed;" if result.messages_loaded else ""
            if result.images_kept:
                kept += f" its {result.images_kept} intact image embedding(s) are kept;"
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
    pending = [_absolute(p) for p in args.image]
    failed = False
    if hasattr(sys.stdin, "reconfigure"):  # a byte that is not UTF-8 under a UTF-8 locale:
        sys.stdin.reconfigure(errors="surrogateescape")  # U+FFFD in a turn, kept in a path
    for raw in sys.stdin:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        command, *rest = line.split(maxsplit=1)
        if command == "/image":  # "/images look blurry, why?" is a question
            image = rest[0].strip() if rest else ""
            if not image:
                _note("error: /image needs a file path.")
                failed = True
            else:
                pending.append(_absolute(_typed_path(image)))
            continue
        regenerate = line.strip() == "/regenerate"
        if regenerate and pending:  # they had been dropped without a word
            _note(
                f"notice: /regenerate answers the last question again; {len(pending)} "
                "picture(s) attached since wait for your next question."
            )
        try:
            if regenerate:
                events = session.regenerate(options)
            else:
                events, pending = session.ask(line, pending, options), []
            interrupted = _stream(events, args, out)
        except MerlinError as e:
            _note(f"error: {e}")
            pending = pending if regenerate else []
            failed = True
            continue
        if target is not None and not _save(session, target, args, out):
            failed = True  # the exit status says the file was not written
        if interrupted:
            _note("interrupted")
            return 130
    if pending:
        _note(f"error: no turn came after the picture {pending[-1]}; it was not sent.")
        failed = True
    return EXIT_USER_ERROR if failed else 0


def _typed_path(text: str) -> str:
    """The file a /image line names as a terminal pastes a dragged file: as typed if that
    exists, else a file:// URL (its bytes: a name need not be UTF-8) or a shell-quoted path
    ('my photo.png', my\\ photo.png) made plain."""
    if os.path.exists(os.path.expanduser(text)):
        return text
    if text.startswith("file://"):
        parsed = urlparse(text)
        if parsed.netloc in ("", "localhost"):
            return os.fsdecode(unquote_to_bytes(parsed.path))
    try:
        words = shlex.split(text)
    except ValueError:  # an unclosed quote: "Bob's.png"
        return text
    return words[0] if len(words) == 1 else text


def _absolute(path: str) -> str:
    """A picture's path as the session keeps it: absolute, so the chat goes on from another
    folder (a relative one was read against wherever the next run started: "gone", or
    another file taken for a changed one)."""
    return os.path.abspath(os.path.expanduser(path))


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


class _SessionFile:
    """Where this run saves its session, and what was there when it loaded or last saved it:
    a file someone else changed meanwhile (another run saving its own turn) is not ours to
    replace."""

    def __init__(self, path: Path):
        self.path = path
        self.seen = _fingerprint(path)

    def opened(self) -> None:
        """After Session.open, which marks the file recently used (a new mtime): that change is
        this run's own when the file is still the same one (inode) of the same size."""
        now = _fingerprint(self.path)
        if now is not None and self.seen is not None and now[:3] == self.seen[:3]:
            self.seen = now

    def changed(self) -> bool:
        """True when the file is there but is not what this run read or wrote (a file removed
        meanwhile holds nothing to lose)."""
        now = _fingerprint(self.path)
        return now is not None and now != self.seen


def _fingerprint(path: Path) -> tuple | None:
    """What identifies one version of a file cheaply (a session may be gigabytes): device,
    inode (a save renames a new file into place), size and modification time; None when the
    file is absent or cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _free_name(path: Path) -> Path:
    """The first `<stem> (n)<suffix>` beside path that does not exist yet."""
    n = 2
    while True:
        candidate = path.with_name(f"{path.stem} ({n}){path.suffix}")
        if not os.path.lexists(candidate):
            return candidate
        n += 1


def _save(session, target: _SessionFile, args, out) -> bool:
    """Save after a turn; to a new file beside the session file if that file changed since this
    run loaded or last saved it (its content is someone else's turn, kept), and from then on
    to the new file. Whether it was written."""
    from ..arrayfile import FileSaveError

    if target.changed():
        moved = _free_name(target.path)
        _note(
            f"warning: {target.path} changed since this run loaded or saved it (another "
            f"`merlin-cli chat --session` run?), so it was not overwritten. This conversation "
            f"is saved to {moved} instead; continue it with --session {moved}."
        )
        target.path, target.seen = moved, None
    try:
        size = session.save(target.path)
    except FileSaveError as e:
        _note(f"warning: the session was not saved: {e}. The conversation goes on in memory.")
        return False
    target.seen = _fingerprint(target.path)
    if args.json:
        _emit(out, {"event": "saved", "path": str(target.path), "bytes": size})
    return True

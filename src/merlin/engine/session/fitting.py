"""Context fitting: which older turns to leave out so the conversation fits the budget.

A pure function of the messages and a `render(dropped) -> Prompt` callable, testable without
a model (tests/engine/session/test_fitting.py renders with a fake). Rules: the system prompt,
the current question and the latest image are always kept; units (a user message and the
replies after it) go oldest first; when turns must go, enough go to reach trim_fraction of the
budget, so the next turns do not trim (and recompute) again at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..errors import InputError
from .conversation import ContextTrimmed, Message

log = logging.getLogger(__name__)


def fit_context(
    messages: Sequence[Message],
    dropped: set[int],
    render: Callable[[set[int]], object],
    *,
    budget: int,
    reserve: int,
    trim_fraction: float = 0.75,
    system: str = "",
    min_tokens: Callable[[Message], int] | None = None,
):
    """(dropped, prompt, ContextTrimmed or None): the messages to leave out (a superset of
    `dropped`) so that the rendered prompt plus `reserve` answer tokens fits `budget`, and
    that prompt. InputError when even the question alone (with the system prompt and the
    latest image) does not fit.

    min_tokens(message), if given, is a lower bound of the tokens a message renders to (its
    text's length over the longest token's): units older than the newest ones whose bounds
    alone pass the budget are left out before anything is rendered, so a conversation of
    megabytes (an API client's) is not tokenized whole, again and again, to find what fits."""
    units: list[list[int]] = []  # a user message and the replies after it; the last: the question
    for i, m in enumerate(messages):
        if m.role == "user" or not units:
            units.append([i])
        else:
            units[-1].append(i)
    last = units[-1] if units else []
    protected: list[int] = []
    if not any(messages[i].images for i in last):
        for u in reversed(units[:-1]):
            if any(messages[i].images for i in u):
                if not all(i in dropped for i in u):
                    protected = u
                break
    limit = budget - reserve
    unreachable, floor = _beyond_reach(messages, units, protected, dropped, limit, min_tokens)
    given = dropped
    dropped = dropped | unreachable
    r = render(dropped)
    if len(r.ids) <= limit and not unreachable:
        return dropped, r, None
    candidates = [u for u in units[:-1] if u is not protected and not all(i in dropped for i in u)]
    tried: dict[int, tuple[set[int], object]] = {0: (dropped, r)}

    def with_k(k: int):
        if k not in tried:
            d = set(dropped)
            for u in candidates[:k]:
                d.update(u)
            tried[k] = (d, render(d))
        return tried[k]

    d_all, r_all = with_k(len(candidates))
    if len(r_all.ids) > limit:
        kept = [
            w for w, c in (("the system prompt", system), ("the latest image", r_all.images)) if c
        ]
        with_ = f" (with {' and '.join(kept)})" if kept else ""
        raise InputError(
            f"this question needs {len(r_all.ids)} tokens{with_}, but the context budget "
            f"is {budget} tokens and {reserve} are kept free for the answer. Shorten the "
            "question"
            + (" or lower the image detail" if r_all.images else "")
            + ", allow fewer answer tokens (max new tokens), raise the context budget in the "
            "settings, or start a new chat."
        )
    goal = min(limit, int(budget * trim_fraction))
    if len(r_all.ids) > goal:
        goal = limit
    lo, hi = (0 if unreachable else 1), len(candidates)  # the fewest units to reach the goal
    while lo < hi:
        mid = (lo + hi) // 2
        if len(with_k(mid)[1].ids) <= goal:
            hi = mid
        else:
            lo = mid + 1
    d, rr = with_k(lo)
    newly = sorted(d - given)
    kept_image = " The system prompt and the latest image were kept." if protected else ""
    notice = (
        f"The conversation no longer fits in the context budget of {budget} tokens: the "
        f"{len(newly)} oldest message(s) were left out of what the model sees (they stay "
        f"in the chat).{kept_image}"
    )
    log.info("%s", notice)
    shrank = len(r.ids) + floor - len(rr.ids)  # floor: the unrendered ones' lower bound
    return d, rr, ContextTrimmed(newly, shrank, len(rr.ids), notice)


def _beyond_reach(messages, units, protected, dropped, limit, min_tokens):
    """(indexes, their token floor): every unit older than the newest ones whose min_tokens
    alone pass `limit` (none without min_tokens). The question's unit and the protected one
    are always kept, so they count first."""
    if min_tokens is None:
        return set(), 0
    kept = [units[-1], protected] if units else []
    floor = sum(min_tokens(messages[i]) for u in kept for i in u)
    older = [u for u in units[:-1] if u is not protected]
    for k in range(len(older) - 1, -1, -1):
        floor += sum(min_tokens(messages[i]) for i in older[k] if i not in dropped)
        if floor > limit:
            out = {i for u in older[: k + 1] for i in u if i not in dropped}
            return out, sum(min_tokens(messages[i]) for i in out)
    return set(), 0

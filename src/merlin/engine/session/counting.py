"""What a turn would cost before it is sent: the prompt tokens the model would see if this
conversation (ending with the draft question) were answered now.

count_prompt() normalizes the messages and fits them to the context budget exactly as
Session.respond() does (the same rendering, the same messages left out, the same answer
reserve), so its `tokens` equals the PrefillDone n_tokens + reused of that turn. It never
touches the KV cache, the session's messages or its dropped set; images are prepared at their
budget (engine/vision/budget.py through the session's ImageBank, memoized by file) but not
encoded. A draft that cannot fit gives fits=False with the engine's own reason, never an
exception: the app shows it as a red meter (app/context_meter.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError
from ..generate import AnswerOptions
from .conversation import Message


@dataclass(frozen=True)
class PromptCount:
    tokens: int  # prompt tokens the model would see (0 when unknown: see problem)
    image_tokens: int  # of them, the tokens of the last message's images
    budget: int  # the context budget in tokens
    reserve: int  # tokens kept free for the answer
    dropped: int  # older messages that would be left out
    fits: bool  # tokens + reserve <= budget (after leaving out older messages)
    problem: str = ""  # the engine's reason when it does not fit or cannot be counted


def count_prompt(session, messages: Sequence[Message], options=None) -> PromptCount:
    """The PromptCount of answering `messages` (ending with a user message) in `session`."""
    options = AnswerOptions.of(options).resolved(session.model)
    reserve = max(1, min(options.max_new_tokens, session.settings.answer_reserve))
    budget = session.budget
    try:
        msgs = session._normalize(messages)
    except InputError as e:  # an unusable or too large image, a huge paste
        return PromptCount(0, 0, budget, reserve, 0, False, str(e))
    if not msgs or msgs[-1].role != "user":
        msgs = [*msgs, Message("user", "")]
    image_tokens = sum(im.n_tokens for im in msgs[-1].images)
    dropped = session._still_left_out(msgs)
    try:
        left_out, prompt, _ = session._fit(msgs, dropped, reserve)
    except InputError as e:  # even the question alone does not fit
        alone = session._render(msgs, set(range(len(msgs) - 1)))
        return PromptCount(len(alone.ids), image_tokens, budget, reserve, len(msgs) - 1, False,
                           str(e))  # fmt: skip
    return PromptCount(len(prompt.ids), image_tokens, budget, reserve, len(left_out), True)

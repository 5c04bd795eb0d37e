"""Thinking models: what the chat template says about a `<think>` ... `</think>` block, the
answer stream split into reasoning and answer, and the thinking budget.

Qwen3-VL -Thinking checkpoints open the block in the generation prompt
(`<|im_start|>assistant\\n<think>\\n`) and always think; Qwen3 text templates take
`enable_thinking` (False renders an empty, closed block, so the model answers at once).
Earlier answers reach the next prompt as the template wants: the session passes each
answer's reasoning as `reasoning_content` and the template keeps it or drops it (the Qwen3
templates keep it only for answers after the last question).

Layout:
    support(tokenizer)              ThinkingSupport: has a block? can enable_thinking switch it?
    template_kwargs(support, mode)  the template variables of a mode (auto | on | off)
    plan_turn(tokenizer, ids, ...)  ThinkingTurn of one answer: is the block open at the start,
                                    the budget, the ids that close it
    ReasoningSplitter               streamed text -> (answer, reasoning) pieces
    Steer                           the generation loop's hook: splits, counts reasoning
                                    tokens, replaces sampled tokens by the closing ids once
                                    the budget is spent
    answer_parts(...)               after the answer: (reasoning, answer, answer ids)

Invariants: the splitter gives the same parts for any chunking of the same text (tags may
arrive as special tokens, whose text the stream decoder shows, or as plain text split across
chunks); a block that never closes is all reasoning; an answer without a block is all answer.
Answer text is what the template would extract: reasoning without the newlines around it,
the answer without the newlines that follow `</think>` (the templates' strip('\\n')).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InputError, TokenizerError

THINK = "<think>"
END_THINK = "</think>"
CLOSE_TEXT = "\n" + END_THINK + "\n\n"  # what the engine feeds when the budget is spent
MODES = ("auto", "on", "off")
_PROBE = "Merlin thinking probe"


@dataclass(frozen=True)
class ThinkingSupport:
    """supported: the template makes the model think (its generation prompt opens a block, or
    `enable_thinking` changes the prompt; a template that only renders the reasoning of
    earlier answers does not count). switchable: `enable_thinking` changes the prompt
    (thinking can be switched off by the template itself). opens: the default
    generation prompt opens the block (the model always starts by thinking). reason: a
    sentence saying why thinking is not available (empty when it is)."""

    supported: bool
    switchable: bool = False
    opens: bool = False
    reason: str = ""


def _probe(tokenizer, **kwargs) -> str:
    return tokenizer.render_chat([{"role": "user", "content": _PROBE}], True, **kwargs)


def _opens(text: str) -> bool:
    """The text's last thinking tag is an opening one (after the last turn start)."""
    start = text.rfind("<|im_start|>")
    tail = text[start:] if start >= 0 else text
    return tail.rfind(THINK) > tail.rfind(END_THINK)


def support(tokenizer) -> ThinkingSupport:
    """What the tokenizer's chat template offers (computed once per tokenizer)."""
    cached = getattr(tokenizer, "_merlin_thinking", None)
    if cached is not None:
        return cached
    result = _support(tokenizer)
    try:
        tokenizer._merlin_thinking = result
    except AttributeError:  # a tokenizer stand-in without attributes: compute each time
        pass
    return result


def _support(tokenizer) -> ThinkingSupport:
    source = getattr(tokenizer, "chat_template", None)
    if not source:
        return ThinkingSupport(False, reason="the model has no chat template")
    none = ThinkingSupport(
        False,
        reason="the model's chat template has no thinking block (an Instruct checkpoint; "
        "use a -Thinking checkpoint to see its reasoning)",
    )
    if not any(s in source for s in (THINK, END_THINK, "enable_thinking", "reasoning_content")):
        return none
    try:
        default = _probe(tokenizer)
        on = _probe(tokenizer, enable_thinking=True)
        off = _probe(tokenizer, enable_thinking=False)
    except TokenizerError as e:
        return ThinkingSupport(False, reason=f"the chat template cannot be rendered ({e})")
    switchable, opens = on != off, _opens(default)
    if not (switchable or opens):  # it only renders earlier reasoning: the model never thinks
        return none
    return ThinkingSupport(True, switchable=switchable, opens=opens)


def check_mode(mode: str) -> str:
    mode = str(mode or "auto").lower()
    if mode not in MODES:
        raise InputError(f"thinking must be one of {', '.join(MODES)}, not {mode!r}.")
    return mode


def template_kwargs(sup: ThinkingSupport, mode: str) -> dict:
    """Template variables for a thinking mode. InputError when `on` is asked of a template
    without thinking."""
    mode = check_mode(mode)
    if mode == "on" and not sup.supported:
        raise InputError(
            f"thinking is switched on, but {sup.reason}. Switch thinking off (or to auto), "
            "or load a -Thinking checkpoint."
        )
    if sup.supported and sup.switchable and mode != "auto":
        return {"enable_thinking": mode == "on"}
    return {}


def check_budget(budget) -> int | None:
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise InputError(
            f"the thinking budget must be a whole number of tokens >= 0, not {budget!r}."
        )
    return budget


@dataclass
class ThinkingTurn:
    """One answer's thinking: active (split the stream: the template has a block), opened
    (the prompt ends inside the block), budget (reasoning tokens before the engine closes the
    block; None: no limit), close_ids (what closes it), end_id (`</think>` as one token)."""

    active: bool = False
    opened: bool = False
    budget: int | None = None
    close_ids: list[int] = field(default_factory=list)
    end_id: int | None = None

    def steer(self) -> Steer:
        return Steer(self)


def _token(tokenizer, text: str) -> int | None:
    try:
        return tokenizer.token_id(text)
    except (KeyError, TokenizerError, ValueError):
        return None


def close_ids(tokenizer) -> tuple[list[int], int | None]:
    end = _token(tokenizer, END_THINK)
    if end is None:
        return tokenizer.encode_text(CLOSE_TEXT), None
    return [*tokenizer.encode_text("\n"), end, *tokenizer.encode_text("\n\n")], end


def plan_turn(tokenizer, prompt_ids, mode: str = "auto", budget: int | None = None):
    """The ThinkingTurn of an answer to prompt_ids (built with template_kwargs(mode)). With
    mode off on a template that always thinks (it cannot be switched off), the budget is 0:
    the engine closes the block at once."""
    sup = support(tokenizer)
    mode = check_mode(mode)
    budget = check_budget(budget)
    if not sup.supported:
        return ThinkingTurn()
    tail = tokenizer.decode(list(prompt_ids[-16:]))
    opened = _opens(tail)
    if mode == "off" and opened:
        budget = 0
    ids, end = close_ids(tokenizer)
    return ThinkingTurn(True, opened, budget, ids, end)


# ---- splitting the stream -----------------------------------------------------------------------

_START, _REASONING, _ANSWER = "start", "reasoning", "answer"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """Streamed answer text -> (answer, reasoning) pieces; see the module docstring."""

    def __init__(self, opened: bool = False) -> None:
        self.state = _REASONING if opened else _START
        self._held = ""
        self._lead = True  # strip the newlines that start the current part
        self.closed = False  # a `</think>` ended the block

    @property
    def in_reasoning(self) -> bool:
        return self.state == _REASONING

    def push(self, text: str) -> tuple[str, str]:
        buf = self._held + text
        self._held = ""
        answer, reasoning = [], []
        while buf:
            if self.state == _START:
                s = buf.lstrip()
                if s.startswith(THINK):
                    self.state, self._lead, buf = _REASONING, True, s[len(THINK) :]
                    continue
                if not s or THINK.startswith(s):
                    self._held = buf  # whitespace or a partial tag: wait
                    break
                self.state, self._lead = _ANSWER, False  # no block: all of it is answer
                continue
            if self._lead:
                buf = buf.lstrip("\n")
                if not buf:
                    break
                self._lead = False
            if self.state == _ANSWER:
                answer.append(buf)
                break
            i = buf.find(END_THINK)
            if i >= 0:
                reasoning.append(buf[:i].rstrip("\n"))
                self.state, self._lead, self.closed = _ANSWER, True, True
                buf = buf[i + len(END_THINK) :]
                continue
            k = _partial_suffix(buf, END_THINK)
            body = buf[: len(buf) - k]
            out = body.rstrip("\n")  # newlines before a `</think>` are dropped
            self._held = body[len(out) :] + buf[len(body) :]
            reasoning.append(out)
            break
        return "".join(answer), "".join(reasoning)

    def finish(self) -> tuple[str, str]:
        """What is held back at the end of the answer."""
        held, self._held = self._held, ""
        if self.state == _REASONING:
            return "", held.rstrip("\n")
        if self.state == _START:
            return "", ""  # only whitespace (or a partial tag nobody finished): nothing
        return held, ""


def split_text(text: str, opened: bool = False) -> tuple[str, str, bool]:
    """(reasoning, answer, closed) of a whole answer text."""
    s = ReasoningSplitter(opened)
    a, r = s.push(text)
    a2, r2 = s.finish()
    return r + r2, a + a2, s.closed


class Steer:
    """The generation loop's thinking hook (one per answer). choose(token) -> the token to
    emit (a closing id instead of the sampled one once the budget is spent); feed(text) ->
    (answer, reasoning) of the emitted token's text; forcing: closing ids are queued (no
    speculative drafts meanwhile)."""

    def __init__(self, turn: ThinkingTurn) -> None:
        self.turn = turn
        self.splitter = ReasoningSplitter(turn.opened) if turn.active else None
        self._forced: list[int] = []
        self._closing = False  # the closing ids were queued (once)
        self.reasoning_tokens = 0  # tokens emitted inside the block (tags included)
        self._counted = False  # the last chosen token counted as reasoning
        self._reasoning: list[str] = []  # the reasoning text so far

    @property
    def forcing(self) -> bool:
        return bool(self._forced)

    @property
    def active(self) -> bool:
        return self.splitter is not None

    def choose(self, token: int) -> int:
        if self.splitter is None:
            return token
        if self._forced:
            token = self._forced.pop(0)
        elif (
            self.splitter.in_reasoning
            and not self._closing
            and self.turn.budget is not None
            and self.reasoning_tokens >= self.turn.budget
            and self.turn.close_ids
        ):
            self._closing = True
            token, *self._forced = self.turn.close_ids
        self._counted = self.splitter.in_reasoning
        if self._counted:
            self.reasoning_tokens += 1
        return token

    def feed(self, text: str) -> tuple[str, str]:
        if self.splitter is None:
            return text, ""
        was = self.splitter.in_reasoning
        out = self.splitter.push(text)
        if self.splitter.in_reasoning and not was and not self._counted:
            self.reasoning_tokens += 1  # the token that opened the block
            self._counted = True
        self._reasoning.append(out[1])
        return out

    def last_was_reasoning(self) -> bool:
        """The last chosen token is part of the reasoning block (its tags included)."""
        return self.splitter is not None and self._counted

    def flush(self, text: str) -> tuple[str, str]:
        """The stream decoder's last text and whatever the splitter held back."""
        answer, reasoning = self.feed(text)
        if self.splitter is None:
            return answer, reasoning
        more_answer, more_reasoning = self.splitter.finish()
        self._reasoning.append(more_reasoning)
        return answer + more_answer, reasoning + more_reasoning

    def totals(self, tokenizer, ids) -> dict:
        """Finished's thinking fields (none for a turn without thinking)."""
        if self.splitter is None:
            return {}
        return dict(
            reasoning="".join(self._reasoning),
            reasoning_tokens=self.reasoning_tokens,
            thinking_budget_closed=self._closing,
            answer_ids=answer_parts(tokenizer, self.turn, ids)[2],
        )


def answer_parts(tokenizer, turn: ThinkingTurn | None, ids) -> tuple[str | None, str, list | None]:
    """(reasoning, answer text, answer ids) of an answer generated as `ids`. reasoning is None
    for a turn without thinking; answer ids are the ids the answer text decodes from (None
    when no token boundary gives exactly that text: the next prompt encodes the text)."""
    ids = [int(t) for t in ids]
    text = tokenizer.decode(ids)
    if turn is None or not turn.active:
        return None, text, ids or None
    reasoning, answer, closed = split_text(text, turn.opened)
    if not closed:
        if reasoning or turn.opened:
            return reasoning, answer, None
        return reasoning, answer, (ids if ids and answer == text else None)
    if turn.end_id is None or turn.end_id not in ids:
        return reasoning, answer, None
    rest = ids[ids.index(turn.end_id) + 1 :]
    while rest and not tokenizer.decode(rest[:1]).strip("\n"):
        rest = rest[1:]
    return reasoning, answer, (rest if rest and tokenizer.decode(rest) == answer else None)

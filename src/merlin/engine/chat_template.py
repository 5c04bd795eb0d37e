"""The sandbox a checkpoint's Jinja chat template runs in, as transformers' apply_chat_template
compiles it (the `generation` tag, raise_exception, tojson, strftime_now), plus a budget.

Why a budget: a chat template is a program from the checkpoint folder. A damaged or hostile
one must not freeze or exhaust the app: rendering stops with a SecurityError (which
engine.tokenizer turns into a TokenizerError) after RENDER_SECONDS, after RENDER_MAX_OPS
template operations plus RENDER_OPS_PER_CHAR for every character of the messages' text (a
value built is charged by its length, and a template copies each message a few times: a
legitimate conversation of 20 MB must not read as a runaway template), or when the output or
a value built by `*` or `+` grows past the limits.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError, safe_range

from . import template_limits

# A chat template is a program from the checkpoint folder. A damaged or hostile one must not
# freeze or exhaust the app: rendering stops with a TokenizerError after this long, after this
# many template operations (calls, lookups, operators, range() items), or when the output or a
# value built by `*`, `+` grows past the limits below.
RENDER_SECONDS = 10.0
RENDER_MAX_OPS = 2_000_000
RENDER_OPS_PER_CHAR = 1.0  # 16 copies of the text, at template_limits.CHARS_PER_OP
RENDER_MAX_VALUE = 16 * 1024 * 1024  # chars (or items) of one value made by * or +
RENDER_MIN_OUTPUT = 1024 * 1024  # chars of output allowed beyond twice the messages' text


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` from transformers: renders its body unchanged.

    transformers uses the tag to mark assistant spans for training masks; some checkpoint
    templates contain it, so it must parse.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    # the message is the template's: bounded, so a 16 MB one does not flood the terminal
    raise jinja2.exceptions.TemplateError(template_limits.short_message(message))


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Like transformers: plain json.dumps, no HTML escaping (Jinja's built-in escapes '<').
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _RenderBudget:
    def __init__(self, max_output: int, max_ops: int) -> None:
        self.deadline = time.perf_counter() + RENDER_SECONDS
        self.ops = 0
        self.max_ops = max_ops
        self.max_output = max_output
        # no value built during the render may be larger than the output may be
        self.bounds = template_limits.Bounds(min(max_output, RENDER_MAX_VALUE), self.charge)

    def charge(self, n: int = 1) -> None:
        before = self.ops
        self.ops += n
        if self.ops > self.max_ops:
            raise SecurityError(f"it ran more than {self.max_ops} operations")
        if (before ^ self.ops) >> 10 and time.perf_counter() > self.deadline:
            raise SecurityError(f"it ran longer than {RENDER_SECONDS:.0f} s")


def _length(x: Any) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else 0


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox transformers uses, plus a per-render budget (see RENDER_SECONDS)."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._local = threading.local()
        self.globals["range"] = self._range

    def current_bounds(self) -> template_limits.Bounds | None:
        budget = getattr(self._local, "budget", None)
        return budget.bounds if budget is not None else None

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        return template_limits.checked_format(self, value.__self__, wrapped)

    def _charge(self, n: int = 1) -> None:
        budget = getattr(self._local, "budget", None)
        if budget is not None:
            budget.charge(n)

    def _range(self, *args: int) -> range:
        r = safe_range(*args)
        self._charge(1 + len(r))
        return r

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._charge()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self._charge()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self._charge()
        bounds = __self.current_bounds()
        if bounds is None:
            return super().call(__context, __obj, *args, **kwargs)
        template_limits.check_call(bounds, __obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return bounds.built("a call", result)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self._charge()
        size = 0
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if _length(seq) and isinstance(n, int):
                    size = _length(seq) * n
        elif operator == "+":
            size = _length(left) + _length(right)
        elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            size = right  # ** : the result has about `right` bits
        if size > RENDER_MAX_VALUE:
            raise SecurityError(f"it builds a value of {size} elements with {operator!r}")
        bounds = self.current_bounds()
        if bounds is None:
            return super().call_binop(context, operator, left, right)
        if operator == "%":
            template_limits.check_mod(bounds, left, right)
        elif size > bounds.limit:
            raise SecurityError(f"it builds a value of {size} elements with {operator!r}")
        result = super().call_binop(context, operator, left, right)
        return bounds.built(f"the operator {operator!r}", result)

    def render_budgeted(
        self,
        template: jinja2.Template,
        max_output: int,
        variables: dict,
        max_ops: int = RENDER_MAX_OPS,
    ) -> str:
        self._local.budget = budget = _RenderBudget(max_output, max_ops)
        try:
            parts, size = [], 0
            for chunk in template.generate(**variables):
                size += len(chunk)
                if size > budget.max_output:
                    raise SecurityError(f"its output passed {budget.max_output} characters")
                budget.charge()
                parts.append(chunk)
            return "".join(parts)
        finally:
            self._local.budget = None


def make_jinja_env() -> _BudgetedSandbox:
    env = _BudgetedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    template_limits.install(env)  # bounded filters, methods, `%`, `~`, lipsum; no folding
    return env

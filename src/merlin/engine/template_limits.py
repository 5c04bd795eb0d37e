"""Memory bounds for chat-template rendering: no value a template builds may grow past a limit.

engine.tokenizer's sandbox charges operations and time and checks `*`, `+` and `**`. A
template can still build huge intermediates through everything else Jinja offers: globals
(`lipsum(10**6)`), filters (`center(10**9)`, `indent`, `wordwrap`, `join` or `string` over a
list holding one big string many times), string methods (`'x'.ljust(10**9)`, `replace`,
`join`, `format`), `%` formatting with a huge width, `~` concatenation doubling a value in a
loop, and block sets / macros whose bodies are joined by `environment.concat`. This module
makes each of those check the size of what it is about to build first:

- `approx_size(obj, limit)`: characters (or items) a value expands to when turned into text
  (nested containers counted with repetition, as repr would), counted only up to `limit`;
- every filter is wrapped: numeric arguments above the limit (widths, counts) are refused,
  the value's expanded size is checked before the filter runs, and the result after;
- string method calls and `%` are checked the same way (width and precision numbers inside
  format strings included);
- `~` and `concat` are replaced by bounded joins (a custom code generator for `~`);
- the constant folder is off (`optimized = False`), so nothing runs at compile time, where
  no budget applies;
- every value built is charged to the render's operation budget at one operation per
  CHARS_PER_OP characters, so the total built over a render is bounded, not only each value.

The limit of one value is the render's output limit (twice the messages' text plus 1 M
characters), at most RENDER_MAX_VALUE. Exceeding anything raises jinja2's SecurityError,
which engine.tokenizer turns into a TokenizerError naming the template.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from jinja2.compiler import CodeGenerator
from jinja2.runtime import Macro
from jinja2.sandbox import SecurityError

CHARS_PER_OP = 16  # a value of n characters costs n / CHARS_PER_OP operations
MAX_PARTS = 10_000  # slice(n) builds n lists: n is bounded by this
_COUNTED = frozenset(["slice"])
MAX_MESSAGE = 2000  # characters of a template's own raise_exception() message kept
_FORMAT_NUMBER = re.compile(r"(?<![\w.])(\d{1,30})")


def approx_size(obj: Any, limit: int) -> int:
    """Characters `obj` expands to as text (strings by length, containers by their items,
    repeated references counted each time), counted up to just past `limit`."""
    total = 0
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, (bytes, bytearray)):
            total += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + len(v)
            if total > limit:
                return total
            for item in v:
                stack.append(item)
                if len(stack) > limit:
                    return limit + 1
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)
            if total > limit:
                return total
            for k, item in v.items():
                stack.append(k)
                stack.append(item)
                if len(stack) > limit:
                    return limit + 1
        else:
            total += 8
        if total > limit:
            return total
    return total


def _check_size(what: str, size: int, limit: int) -> None:
    if size > limit:
        raise SecurityError(f"{what} would build a value of more than {limit} characters")


def _check_numbers(what: str, args, limit: int) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > limit:
            raise SecurityError(f"{what} was given the number {a}, above the limit of {limit}")


def _format_widths(fmt: str, limit: int) -> None:
    """Refuse width/precision numbers above `limit` inside a format string (`%...d`, `{:>N}`),
    and `*` widths (taken from the arguments, unknown here)."""
    if not isinstance(fmt, str):
        return
    for part in re.findall(r"%[^a-zA-Z%]*[a-zA-Z%]|\{[^{}]*\}", fmt):
        if "*" in part and part.startswith("%"):
            raise SecurityError("a % format with a * width is not allowed in a chat template")
        for m in _FORMAT_NUMBER.finditer(part):
            if int(m.group(1)) > limit:
                raise SecurityError(f"a format width of {m.group(1)} is above the limit of {limit}")


class Bounds:
    """The limits of the current render (engine.tokenizer sets `limit` and `charge`)."""

    def __init__(self, limit: int, charge) -> None:
        self.limit = limit
        self.charge = charge

    def built(self, what: str, value: Any) -> Any:
        """Check and charge a value just built; returns it."""
        if isinstance(value, (str, list, tuple, dict)):
            size = len(value)
            _check_size(what, size, self.limit)
            self.charge(1 + size // CHARS_PER_OP)
        return value

    def before(self, what: str, args, kwargs) -> None:
        """Check the inputs of a filter or method call before it runs."""
        values = list(args) + list(kwargs.values()) if kwargs else args
        if all(type(v) is str for v in values):  # the common case, kept cheap
            size = sum(len(v) for v in values)
            _check_size(what, size, self.limit)
            if size >= CHARS_PER_OP:
                self.charge(size // CHARS_PER_OP)
            return
        _check_numbers(what, values, self.limit)
        size = 0
        for v in values:
            size += approx_size(v, self.limit - size)
            _check_size(what, size, self.limit)
        self.charge(1 + size // CHARS_PER_OP)


def bounded_filter(env, name: str, f):
    """`f` wrapped to check its inputs and result against the render's bounds."""

    @functools.wraps(f)  # keeps jinja_pass_arg (the context / environment argument)
    def wrapper(*args, **kwargs):
        bounds = env.current_bounds()
        if bounds is None:
            return f(*args, **kwargs)
        skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0
        what = f"the filter {name!r}"
        if name == "join" and len(args) > skip and not hasattr(args[skip], "__len__"):
            args = (*args[:skip], list(args[skip]), *args[skip + 1 :])  # counted below
        bounds.before(what, args[skip:], kwargs)
        if name in _COUNTED and len(args) > skip + 1:
            _check_numbers(what, args[skip + 1 : skip + 2], MAX_PARTS)
        if name in _REPEATING:
            _check_size(what, _REPEATING[name](bounds.limit, *args[skip:], **kwargs), bounds.limit)
        return bounds.built(what, f(*args, **kwargs))

    return wrapper


# Filters whose output can be a product of their inputs' sizes (a separator or replacement
# repeated per item or match, an indent per line): a bound of the characters they build, from
# Jinja's own signatures, checked before they run.


def _join_size(limit: int, value: Any = (), d: Any = "", attribute: Any = None) -> int:
    sep = len(d) if isinstance(d, str) else 8
    return approx_size(value, limit) + len(value) * sep if hasattr(value, "__len__") else 0


def _replace_size(limit: int, s: Any = "", old: Any = "", new: Any = "", count: Any = None) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return approx_size(s, limit) * (1 + approx_size(new, limit))
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * len(new)


def _indent_size(limit: int, s: Any = "", width: Any = 4, first: Any = False, blank: Any = False):
    text = s if isinstance(s, str) else ""
    per_line = width if isinstance(width, int) else approx_size(width, limit)
    return approx_size(s, limit) + (text.count("\n") + 1) * max(0, per_line)


_REPEATING = {"join": _join_size, "replace": _replace_size, "indent": _indent_size}


_AMPLIFYING = frozenset(["replace", "expandtabs", "join", "center", "ljust", "rjust", "zfill"])


def check_call(bounds: Bounds, obj: Any, args, kwargs) -> None:
    """Before a call from a template: bounded inputs; format strings checked."""
    if (not args and not kwargs) or isinstance(obj, Macro):
        return  # a macro's output is joined by the bounded concat: nothing to check here
    name = getattr(obj, "__name__", "a function")
    what = "a call"
    bounds.before(what, args, kwargs)
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, str) and name in _AMPLIFYING:
        what = f"the call {name}()"
        if name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, str) and isinstance(new, str):
                hits = owner.count(old) if old else len(owner) + 1
                _check_size(what, len(owner) + hits * len(new), bounds.limit)
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                _check_size(what, len(owner) + owner.count("\t") * tab, bounds.limit)
        elif name == "join" and args:
            _check_size(
                what,
                approx_size(args[0], bounds.limit) * (1 + len(owner)),
                bounds.limit,
            )


def checked_format(env, fmt: str, wrapped):
    """The sandbox's str.format wrapper, checking the format string's widths first."""

    def checked(*args, **kwargs):
        bounds = env.current_bounds()
        if bounds is not None:
            _format_widths(fmt, bounds.limit)
        return wrapped(*args, **kwargs)

    return checked


def check_mod(bounds: Bounds, left: Any, right: Any) -> None:
    """Before `left % right` (string formatting)."""
    if isinstance(left, str):
        _format_widths(left, bounds.limit)
        size = len(left) + approx_size(right, bounds.limit)
        _check_size("a % format", size, bounds.limit)


def bounded_concat(env):
    """A replacement for environment.concat / `~`: joins after checking the total size."""

    def concat(parts) -> str:
        bounds = env.current_bounds()
        pieces = [p if isinstance(p, str) else str(p) for p in parts]
        if bounds is not None:
            total = 0
            for p in pieces:
                total += len(p)
                _check_size("joining text", total, bounds.limit)
            bounds.charge(1 + total // CHARS_PER_OP)
        return "".join(pieces)

    return concat


def bounded_lipsum(env, original):
    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
        bounds = env.current_bounds()
        if bounds is not None:
            _check_numbers("lipsum()", (n, min, max), 1000)
            _check_size("lipsum()", n * max * 12, bounds.limit)
        return original(n, html, min, max)

    return lipsum


def short_message(message: Any) -> str:
    """A template's own error message (raise_exception), cut to MAX_MESSAGE characters."""
    text = message if isinstance(message, str) else repr(message)[:MAX_MESSAGE]
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + f"... ({len(text) - MAX_MESSAGE:,} more characters)"
    return text


class BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` compiles to environment.bounded_join((a, b)) instead of str_join((a, b))."""

    def _output_child_to_const(self, node, frame, finalize):
        """Jinja evaluates `{{ constant expression }}` at compile time, outside any budget
        (`{{ "x"|center(10**9) }}` would run while the template loads): only literal text
        is folded here."""
        from jinja2 import nodes

        if isinstance(node, nodes.TemplateData):
            return super()._output_child_to_const(node, frame, finalize)
        raise nodes.Impossible()

    def visit_Concat(self, node, frame) -> None:  # noqa: N802
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def install(env) -> None:
    """Make `env` (engine.tokenizer's sandbox, with a current_bounds() method) bounded."""
    env.optimized = False  # no constant folding: nothing a template says runs at compile time
    env.code_generator_class = BoundedCodeGenerator
    join = bounded_concat(env)
    env.concat = join
    env.bounded_join = join
    if "lipsum" in env.globals:
        env.globals["lipsum"] = bounded_lipsum(env, env.globals["lipsum"])
    env.filters = {name: bounded_filter(env, name, f) for name, f in env.filters.items()}

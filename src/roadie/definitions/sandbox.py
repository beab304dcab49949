"""The Jinja sandbox event templates run in, with every way a template builds a value bounded.

A one-line template can ask for gigabytes: `{{ 'x' * 10**10 }}`, `{{ 'x' | center(10**9) }}`,
a chain of `~`, `%` with a width, `replace` or `join` with a long string, a list of long
strings turned into text. A time limit alone does not stop these: most are one call into
C, which no exception interrupts, and which holds the memory until it returns. So each
operation that can make its result much larger than its operands is checked *before* it
runs, against what its result would come to (`weight`, counted as text), and refused
past `MAX_SEQUENCE` with a `SecurityError` naming the operation: the `+`, `*`, `%` and `**`
operators, `~`, method calls, the filters that pad, repeat or insert, the buffers of
blocks and macros, and every value written out. Nothing is evaluated when a template is
compiled (the optimizer's constant folding would run the same operations unchecked).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping
from functools import wraps
from typing import Any

from jinja2 import StrictUndefined, filters, nodes, pass_context, pass_environment, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum

MAX_SEQUENCE = 1_000_000
"""The most characters (or items) any value a template builds may come to."""
MAX_EXPONENT = 1_000
MAX_INT_BITS = 100_000  # an int past this has more than 30,000 digits: no event needs one
_MAX_JSON_INDENT = 100
_MAX_LIPSUM_WORDS = 100_000


def weight(value: Any, limit: int = MAX_SEQUENCE) -> int:
    """About how many characters `value` comes to as text (its `str`), counted only until
    the count passes `limit`: a list of a million references to one long string weighs
    what printing it would write, not the few megabytes it holds."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes | bytearray):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        elif isinstance(item, float):
            total += 24
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + 2 * len(item)
            stack.extend(item)
        else:
            total += 1  # generators, ranges, Undefined, macros: their text is short
        if total > limit:
            return total
    return total


def _refuse_over(size: int, what: str, unit: str = "characters") -> None:
    if size > MAX_SEQUENCE:
        raise SecurityError(f"{what} would come to more than {MAX_SEQUENCE:,} {unit}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- formatting: what `%`, `format` and str.format add beyond their operands ---------------

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")
_SPEC_NUMBERS = re.compile(r"\d+")


def _widest(values: Iterable[Any]) -> int:
    return max((abs(v) for v in values if _is_int(v)), default=0)


def _format_values(args: Any) -> list[Any]:
    if isinstance(args, Mapping):
        return list(args.values())
    if isinstance(args, tuple):
        return list(args)
    return [args]


def check_printf(fmt: str, args: Any) -> None:
    """Refuse `fmt % args` when its widths and values would make it too large."""
    values = _format_values(args)
    widest = _widest(values)  # what a `*` width may take
    padding = 0
    for match in _PRINTF.finditer(fmt):
        for number in match.groups():
            if number == "*":
                padding += widest
            elif number:
                padding += int(number)
    _refuse_over(len(fmt) + padding + weight(values), "the result of '%'")


def check_str_format(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse `fmt.format(...)` when its widths and values would make it too large."""
    values = [*args, *kwargs.values()]
    widest = _widest(values)  # what a nested `{:{w}}` width may take
    padding = 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format says what is wrong
    for _, _, spec, _ in fields:
        if spec:
            padding += sum(int(n) for n in _SPEC_NUMBERS.findall(spec)) + (widest if "{" in spec else 0)
    _refuse_over(len(fmt) + padding + weight(values), "the result of format()")


# --- filters: the built-in ones that can make much more than they are given -----------------


def _center(value: Any, width: int = 80) -> str:
    _refuse_over(max(width, 0) if _is_int(width) else 0, "center()")
    return filters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    text = str(s)
    per_line = width if isinstance(width, int) else len(str(width))
    _refuse_over(len(text) + (text.count("\n") + 1) * max(per_line, 0), "indent()")
    return filters.do_indent(s, width, first, blank)


@pass_eval_context
def _replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    text, old_text, new_text = str(s), str(old), str(new)
    times = text.count(old_text) if old_text else len(text) + 1
    if count is not None and _is_int(count) and count >= 0:
        times = min(times, count)
    _refuse_over(len(text) + times * max(len(new_text) - len(old_text), 0), "replace()")
    return filters.do_replace(eval_ctx, s, old, new, count)


@pass_eval_context
def _join(eval_ctx: Any, value: Any, d: str = "", attribute: str | int | None = None) -> str:
    items = list(value)
    _refuse_over(weight(items) + len(str(d)) * max(len(items) - 1, 0), "join()")
    return filters.sync_do_join(eval_ctx, items, d, attribute)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    check_printf(str(value), kwargs or args)
    return filters.do_format(value, *args, **kwargs)


@pass_environment
def _wordwrap(
    environment: Any,
    s: str,
    width: int = 79,
    break_long_words: bool = True,
    wrapstring: str | None = None,
    break_on_hyphens: bool = True,
) -> str:
    text = str(s)
    between = len(wrapstring) if isinstance(wrapstring, str) else 2
    lines = len(text) // max(width if _is_int(width) else 1, 1) + text.count("\n") + 1
    _refuse_over(len(text) + lines * between, "wordwrap()")
    return filters.do_wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)


@pass_eval_context
def _tojson(eval_ctx: Any, value: Any, indent: int | None = None) -> Any:
    if indent is not None and (not _is_int(indent) or indent > _MAX_JSON_INDENT):
        raise SecurityError(f"tojson(indent={indent!r}): an indent is at most {_MAX_JSON_INDENT}")
    # Escaping may write six characters for one; each item of a nested value a line.
    _refuse_over(weight(value) * (2 + (indent or 0)), "tojson()")
    return filters.do_tojson(eval_ctx, value, indent)


def _pprint(value: Any) -> str:
    _refuse_over(2 * weight(value), "pprint()")
    return filters.do_pprint(value)


def _batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
    _refuse_over(linecount if _is_int(linecount) else 0, "batch()")
    if fill_with is not None:
        _refuse_over(weight(fill_with) * linecount, "batch()")
    return filters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None) -> Any:
    _refuse_over(slices if _is_int(slices) else 0, "slice()")
    if fill_with is not None:
        _refuse_over(weight(fill_with) * slices, "slice()")
    return filters.sync_do_slice(value, slices, fill_with)


@pass_environment
def _sum(environment: Any, iterable: Any, attribute: str | int | None = None, start: Any = 0) -> Any:
    items = list(iterable)
    if attribute is not None:
        items = list(map(filters.make_attrgetter(environment, attribute), items))
    if _is_number(start) and all(_is_number(item) for item in items):
        return sum(items, start)
    # Lists (or tuples) summed one `+` at a time copy the whole so far at each step, in C,
    # where no time limit reaches: join them once instead.
    _refuse_over(weight(start) + weight(items), "sum()")
    if isinstance(start, list | tuple) and all(isinstance(item, list | tuple) for item in items):
        joined = [x for part in (start, *items) for x in part]
        return joined if isinstance(start, list) else tuple(joined)
    return sum(items, start)


@pass_eval_context
def _urlize(eval_ctx: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    text = str(value)
    added = sum(len(str(v)) for v in (*args, *kwargs.values()) if isinstance(v, str))
    _refuse_over(3 * len(text) + (len(text) // 3 + 1) * added, "urlize()")
    return filters.do_urlize(eval_ctx, value, *args, **kwargs)


BOUNDED_FILTERS: dict[str, Callable[..., Any]] = {
    "center": _center,
    "indent": _indent,
    "replace": _replace,
    "join": _join,
    "format": _format,
    "wordwrap": _wordwrap,
    "tojson": _tojson,
    "pprint": _pprint,
    "batch": _batch,
    "slice": _slice,
    "sum": _sum,
    "urlize": _urlize,
}


def _checked_result(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """`f`, its result refused when it weighs too much (what every filter also gets)."""

    @wraps(f)  # keeps `jinja_pass_arg`, which says what Jinja passes it first
    def checked(*args: Any, **kwargs: Any) -> Any:
        result = f(*args, **kwargs)
        if isinstance(result, str | bytes | list | tuple | dict):
            _refuse_over(weight(result), f"the result of {name}()")
        return result

    return checked


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    if not all(_is_int(v) for v in (n, min, max)) or n * max > _MAX_LIPSUM_WORDS:
        raise SecurityError(f"lipsum() writes at most {_MAX_LIPSUM_WORDS:,} words")
    return generate_lorem_ipsum(n, html, min, max)


# --- the environment -----------------------------------------------------------------------

# Methods that grow the list, dict or set they belong to (the sandbox lets a template call them).
_GROWS = frozenset({"append", "extend", "insert", "update", "setdefault", "add", "__iadd__"})


class _Generator(CodeGenerator):
    """Jinja's code generator, with `~` made a call of the environment's, so that it is
    bounded as `+` is (Jinja joins its operands itself, out of the sandbox's reach)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat_operands((")
        for operand in node.nodes:
            self.visit(operand, frame)
            self.write(", ")
        self.write("))")


@pass_context
def _finalize(context: Context, value: Any) -> Any:
    """What `{{ ... }}` writes, refused before it is made text when it would be too much.
    (Taking the context also keeps Jinja from evaluating constants when it compiles.)"""
    _refuse_over(weight(value), "the value written")
    return value


class Sandbox(SandboxedEnvironment):
    """The sandbox, plus refusal of whatever would build a value past `MAX_SEQUENCE`."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self) -> None:
        super().__init__(
            undefined=StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            optimized=False,  # constant folding would run filters and `~` unchecked, at compile time
            finalize=_finalize,
        )
        for name, f in self.filters.items():
            self.filters[name] = _checked_result(name, BOUNDED_FILTERS.get(name, f))
        self.globals["lipsum"] = _lipsum

    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        """The buffers of blocks, macros and `{% set %}...{% endset %}`, joined, bounded."""
        size, kept = 0, []
        for part in parts:
            size += len(part)
            _refuse_over(size, "a block's text")
            kept.append(part)
        return "".join(kept)

    @staticmethod
    def concat_operands(operands: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...`."""
        _refuse_over(sum(weight(operand) for operand in operands), "the result of '~'")
        return "".join(map(str, operands))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and _is_number(left) and _is_number(right):
            if abs(right) > MAX_EXPONENT and abs(left) > 1:
                raise SecurityError(f"exponent {right!r} is too large")
            if _is_int(left) and _is_int(right) and right > 0 and left.bit_length() * right > MAX_INT_BITS:
                raise SecurityError("the result of '**' would be too large a number")
        elif operator == "*":
            if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise SecurityError("the result of '*' would be too large a number")
            for seq, times in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and _is_int(times) and times > 0
                if sized and (
                    len(seq) * times > MAX_SEQUENCE or weight(seq, MAX_SEQUENCE // times) * times > MAX_SEQUENCE
                ):
                    raise SecurityError("the result of '*' would be too large")
        elif operator == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                _refuse_over(weight(left) + weight(right), "the result of '+'")
        elif operator == "%" and isinstance(left, str):
            check_printf(left, right)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__
        format_map = value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            if format_map and args and isinstance(args[0], Mapping):
                check_str_format(fmt, (), args[0])
            else:
                check_str_format(fmt, args, kwargs)
            return wrapped(*args, **kwargs)

        return bounded

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "a call")
        if isinstance(owner, str | bytes | list | tuple):
            for value in (*args, *kwargs.values()):
                if _is_number(value) and abs(value) > MAX_SEQUENCE:
                    raise SecurityError(f"{value!r} is too large an argument for {name}()")
        if isinstance(owner, str | bytes):
            _check_text_method(owner, name, args, kwargs)
        elif isinstance(owner, list | dict | set) and name in _GROWS:
            # Counted in items, not weighed: weighing the whole at each append of a loop
            # would be quadratic. What it holds is weighed when it is made text.
            given = (*args, *kwargs.values())
            added = sum(len(v) if isinstance(v, list | tuple | dict | set | frozenset | str) else 1 for v in given)
            _refuse_over(len(owner) + added, f"{name}()", "items")
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, str | bytes | list | tuple | dict):
            _refuse_over(weight(result), f"the result of {name}()")
        return result


def _check_text_method(text: str | bytes, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse the string methods that can make much more than they are given, before they run."""
    given = [*args, *kwargs.values()]
    if name == "expandtabs":
        size = given[0] if given and _is_int(given[0]) else 8
        tabs = text.count("\t") if isinstance(text, str) else text.count(b"\t")
        _refuse_over(len(text) + tabs * max(size, 0), "expandtabs()")
    elif name == "replace" and len(given) >= 2:
        old, new = given[0], given[1]
        if isinstance(old, type(text)) and isinstance(new, type(text)):
            times = text.count(old) if old else len(text) + 1  # type: ignore[arg-type]  # both str or both bytes
            _refuse_over(len(text) + times * max(len(new) - len(old), 0), "replace()")
    elif name == "join" and given:
        items = list(given[0]) if isinstance(given[0], list | tuple | set | frozenset | dict) else None
        if items is not None:
            _refuse_over(weight(items) + len(text) * max(len(items) - 1, 0), "join()")
    elif name == "translate" and given and isinstance(given[0], Mapping):
        longest = max((weight(v) for v in given[0].values()), default=1)
        _refuse_over(len(text) * max(longest, 1), "translate()")


ENV = Sandbox()
"""The one environment every template of every event is evaluated in."""

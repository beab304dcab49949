"""PyYAML's syntax errors in the words of the person who wrote the file.

PyYAML names the parser's state, not the mistake: an indentation slip comes back as
`expected <block end>, but found '<block mapping start>'`, an unquoted template as
`found unhashable key`. `explain` reads the error with the file's text and says what is
wrong and how to fix it, at the line where the mistake is (which is not always the line
PyYAML stopped at: an unclosed quote is found at the end of the file), with the field
the line belongs to. What it does not recognise it passes on in PyYAML's words.

The field comes from the text's indentation alone (`outline`), as the file cannot be
parsed: it is the path a reader of the file would see, good enough to say where.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import yaml

from roadie.definitions.render import field_path

# A key at the start of a line's content: quoted, or plain text up to `:` and a space.
_KEY = re.compile(r"""("[^"]*"|'[^']*'|[^\s#'"{\[\]},&*!|>%@`?-][^#]*?|-[^\s#]+?)\s*:(?:\s|$)""")
_ITEM = re.compile(r"-(?:\s+|$)")
_BLOCK_SCALAR = re.compile(r":\s+[|>][-+0-9]*\s*(?:#.*)?$")


@dataclass(frozen=True)
class Said:
    """A syntax error as a person would put it: where (1-based line, field) and what."""

    line: int | None
    field: str
    message: str


@dataclass
class _Entry:
    column: int
    key: str | None  # a mapping key, or None for a list item
    index: int = 0
    line: int = 0
    closed: bool = True  # a list item, or a key with its value on its own line


@dataclass(frozen=True)
class Line:
    """One line of the file as its indentation reads: its key's path and column."""

    number: int
    column: int  # where its key (or, for a bare item, its content) starts
    key: str | None
    path: tuple[str | int, ...]
    has_value: bool  # the key has a value on this line (`name: x`, not `steps:`)


def outline(text: str) -> dict[int, Line]:
    """Each line that holds a key or a list item, by line number, with the field path its
    indentation gives it. Comments, blank lines and block scalars' text are skipped."""
    stack: list[_Entry] = []
    out: dict[int, Line] = {}
    block_column: int | None = None  # inside a `key: |` block, the column of its key
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.lstrip(" \t")  # a tab is refused by YAML, but still indents what follows it
        column = len(raw) - len(stripped)
        if block_column is not None:
            if not stripped.strip() or column > block_column:
                continue
            block_column = None
        if not stripped.strip() or stripped.startswith("#") or stripped.startswith(("---", "...")):
            continue
        position = column
        while match := _ITEM.match(raw, position):
            # An item belongs to the key above it at its own column only when that key
            # has no value of its own (`phases:` then `- name: x` under it).
            index = 0
            while stack and (stack[-1].column > position or (stack[-1].column == position and stack[-1].closed)):
                gone = stack.pop()
                if gone.column == position and gone.key is None:
                    index = gone.index + 1
                    break
            stack.append(_Entry(position, None, index, number))
            position = match.end()
        key_match = _KEY.match(raw, position)
        key = key_match.group(1).strip("\"'") if key_match else None
        if key_match is not None and key is not None:
            while stack and stack[-1].column >= position:
                stack.pop()
            rest = raw[key_match.end() :].strip()
            has_value = bool(rest) and not rest.startswith("#")
            stack.append(_Entry(position, key, line=number, closed=has_value))
            if _BLOCK_SCALAR.search(raw):
                block_column = position
        else:
            has_value = True
            if position == column:  # text with no key: it belongs to what is further out
                while stack and stack[-1].column >= position:
                    stack.pop()
        path = tuple(e.key if e.key is not None else e.index for e in stack)
        out[number] = Line(number, position, key, path, has_value)
    return out


def explain(error: yaml.MarkedYAMLError, text: str) -> Said:
    """What `error` means in `text`, at the line of the mistake."""
    problem = error.problem or ""
    context = error.context or ""
    at = _line_of(error.problem_mark)
    opened = _line_of(error.context_mark)
    lines = outline(text)
    source_lines = text.splitlines()

    def field(number: int | None) -> str:
        found = lines.get(number) if number is not None else None
        return field_path(found.path) if found else ""

    def said(number: int | None, message: str, field_line: int | None = None) -> Said:
        return Said(number, field(field_line if field_line is not None else number), f"invalid YAML: {message}")

    if "found character '\\t'" in problem:
        return said(at, "a tab: YAML is indented with spaces only; replace the tab with spaces")
    if character := re.match(r"found character '(.)' that cannot start any token", problem):
        mark = character.group(1)
        return said(at, f"a value cannot begin with {mark!r} unless it is quoted: put the value in quotes")
    if problem == "found unhashable key":
        line_text = source_lines[at - 1] if at and at <= len(source_lines) else ""
        if "{{" in line_text or "{%" in line_text:
            return said(
                at,
                'a template must be quoted: write it in quotes, e.g. "{{ region }}" '
                "(unquoted, YAML reads the { as the start of a mapping)",
            )
        return said(at, "a key that is a list or a mapping: a key is plain text")
    if problem.startswith("found undefined alias"):
        name = problem.rsplit(" ", 1)[-1]
        return said(at, f"*{name.strip(chr(39))} names no &anchor above it (quote the value if the * is meant as text)")
    if "expected a single document" in context or "but found another document" in problem:
        return said(at, "a second document (---): an event file holds one event")
    if "could not find expected ':'" in problem:
        return said(opened, "a line with no 'key: value': is a ':' missing?")
    if "found unexpected end of stream" in problem and "quoted scalar" in context:
        return said(opened, "a quote opened on this line is never closed")
    if flow := re.match(r"expected ',' or '([}\]])', but got", problem):
        close = flow.group(1)
        opening = "{" if close == "}" else "["
        return said(
            opened,
            f"the {opening} opened on this line is not closed with {close}, or a ',' is missing between its items",
        )
    if problem == "mapping values are not allowed here":
        return _colon(at, source_lines, lines, error, said)
    if problem.startswith("expected <block end>, but found"):
        return _indentation(at, problem, lines, said)
    what = " ".join(part for part in (context, problem) if part) or "cannot parse"
    return said(at if at is not None else opened, what)


def _colon(
    at: int | None, source_lines: list[str], lines: dict[int, Line], error: yaml.MarkedYAMLError, said: _Say
) -> Said:
    """`mapping values are not allowed here`: a `: ` inside an unquoted value, or a key
    indented under a key that already has its value."""
    mark = error.problem_mark
    line_text = source_lines[at - 1] if at and at <= len(source_lines) else ""
    before = line_text[: mark.column] if mark is not None else ""
    if _KEY.search(before.lstrip(" -")):
        return said(at, "a ': ' inside an unquoted value: put the value in quotes")
    above = _line_above(lines, at)
    if above is not None and above.key is not None and above.has_value:
        return said(
            at,
            f"this line is indented more than '{above.key}:' on line {above.number}, which already has a value: "
            f"indent it as far as '{above.key}:' (or, if it belongs inside '{above.key}', remove that value)",
            field_line=above.number,
        )
    return said(at, "a ':' where YAML does not expect a key: check this line's indentation, or quote the value")


def _indentation(at: int | None, problem: str, lines: dict[int, Line], said: _Say) -> Said:
    """`expected <block end>, but found ...`: a line whose indentation matches none of the
    lines above it, or an item where a key belongs (or the other way round)."""
    found = problem.split("but found ", 1)[1].strip("'")
    if found in ("-", "<block sequence start>"):
        return said(
            at,
            "a list item ('- ') among keys: line it up with the other items of its list, or put the list under a key",
        )
    if found == "?":
        return said(
            at,
            "a key among list items: indent it under the item it belongs to, or begin a new item with '- '",
        )
    if found == "<scalar>":
        return said(at, "text after a value's closing quote: put the whole value inside the quotes")
    here = lines.get(at) if at is not None else None
    if here is None or at is None:
        return said(at, "this line's indentation lines it up with no key above it")
    # The columns a key may take here: those of the lines it could belong beside, read
    # upwards, each further out than the last.
    open_columns: list[int] = []
    for number in sorted((n for n in lines if n < at), reverse=True):
        if not open_columns or lines[number].column < open_columns[-1]:
            open_columns.append(lines[number].column)
    choices = ", ".join(str(c) for c in open_columns[:-1])
    choices = f"{choices} or {open_columns[-1]}" if choices else str(open_columns[-1] if open_columns else 0)
    return said(
        at,
        f"this line is indented {here.column} spaces, which lines it up with no key above it: "
        f"indent it as the key it belongs beside ({choices} spaces)",
    )


def _line_above(lines: dict[int, Line], at: int | None) -> Line | None:
    if at is None:
        return None
    earlier = [number for number in lines if number < at]
    return lines[max(earlier)] if earlier else None


def _line_of(mark: yaml.Mark | None) -> int | None:
    return mark.line + 1 if mark is not None else None


class _Say(Protocol):
    """The shape of `explain`'s `said`, for the helpers it hands it to."""

    def __call__(self, number: int | None, message: str, field_line: int | None = None) -> Said: ...

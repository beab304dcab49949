"""Durations as operators write them: `90s`, `10m`, `1h30m`, `2d`, or a number of seconds."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds in `value`; raises ValueError with a message fit for an operator."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration (write e.g. 30s, 10m, 1h30m)")
    text = value.strip().replace(" ", "")
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"{value!r} is not a duration (write e.g. 30s, 10m, 1h30m)")
    return total


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"


# Its JSON Schema says what it accepts, so that a remote module's manifest lets an event
# write `10m` as well as `600`.
DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d)\s*)+$"},
    ],
    "description": "seconds, or a duration such as 500ms, 10s, 5m, 1h30m, 2d",
}
Duration = Annotated[
    float, BeforeValidator(parse_duration), PlainSerializer(lambda s: s), WithJsonSchema(DURATION_SCHEMA)
]
"""A pydantic field type: accepts `10m` or seconds, holds seconds as a float."""

"""JSON as the store writes and reads its JSON columns: orjson where it gives what json
would, json where it would not."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pydantic_core

# Nineteen digits in a row may be an integer past 64 bits, which orjson reads as a float.
# Looked for by turning every digit into a 0 (bytes.translate: a regular expression takes
# four times as long as orjson's whole decoding).
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_DIGITS = b"0" * 19
# Bytes are searched here with `find`, not `in`: `in` first asks whether the needle is an
# integer (a byte), and a bytes needle answers with a TypeError raised and caught, which
# costs twice the search. Three searches a step.


def json_loads(text: str | bytes) -> Any:
    """A JSON column's value: orjson, which takes a third of json's time, unless the text
    holds what orjson reads otherwise or refuses (an integer past 64 bits, which it makes
    a float; NaN and infinities): json reads those exactly, as it always has."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if raw.translate(_DIGITS_AS_ZEROS).find(_NINETEEN_DIGITS) < 0:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


# What orjson would write otherwise than json does is left to json: values it refuses (an
# integer past 64 bits, a key that is not a string, a lone surrogate, a subclass of a JSON
# type, a dataclass or a time, which json refuses too), and NaN and the infinities, which
# it writes as null (so a value whose text has a null goes to json if it holds one). It
# writes a UUID and an Enum, which json refuses, as their text and their value.
_ORJSON_EXACT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def json_dumps(value: Any, *, allow_nan: bool = True) -> str:
    """A JSON column's text: orjson's (compact, UTF-8), which takes a quarter of json's time,
    where it reads back as the same value; json's otherwise. `allow_nan=False` raises
    `ValueError` for NaN and the infinities, as json does."""
    if value is None:
        return "null"
    try:
        text = orjson.dumps(value, option=_ORJSON_EXACT)
    except orjson.JSONEncodeError:
        return json.dumps(value, allow_nan=allow_nan)
    if text.find(b"null") >= 0 and _non_finite(value):
        return json.dumps(value, allow_nan=allow_nan)
    return text.decode()


def _non_finite(value: Any) -> bool:
    """Whether `value` may hold NaN or an infinity, which orjson writes as null. Asked of
    pydantic-core's writer, which says them as `NaN` and `Infinity`: a third of json's time
    for a large value (a run's definition, with its nulls). Either word anywhere in its
    text, a string's included, answers yes: json then writes, as it did."""
    try:
        said = pydantic_core.to_json(value, inf_nan_mode="constants")
    except Exception:  # what it cannot write, json decides about
        return True
    return said.find(b"NaN") >= 0 or said.find(b"Infinity") >= 0

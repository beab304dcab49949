"""How the store writes and reads its values: times on SQLite, JSON, rows as objects."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine, insert, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite import DATETIME

from roadie.states import StepStatus
from roadie.store.json_text import json_dumps, json_loads
from roadie.store.rows import AuditRow, from_row, from_rows
from roadie.store.tables import UTCDateTime, audit, metadata

SQLITE = sqlite.dialect()
TIMES = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30)), timezone(timedelta(hours=13))]),
)


@given(TIMES)
def test_a_time_on_sqlite_is_written_as_sqlalchemy_writes_it_and_read_back_the_same_instant(when: datetime) -> None:
    """UTCDateTime writes SQLite's text itself, faster than SQLAlchemy's DATETIME does: the
    text must be the same, character for character (rows written before and after compare
    in SQL as text, and text order must stay time order), and read back as the same instant."""
    write = UTCDateTime().bind_processor(SQLITE)
    read = UTCDateTime().result_processor(SQLITE, None)
    text = write(when)
    assert text == DATETIME().bind_processor(SQLITE)(when.astimezone(UTC).replace(tzinfo=None))
    back = read(text)
    assert back == when
    assert back.tzinfo is UTC


def test_a_time_on_sqlite_in_another_text_is_still_read() -> None:
    """Text another writer left (whole seconds, an offset, a T) reads as the time it says."""
    read = UTCDateTime().result_processor(SQLITE, None)
    assert read("2026-12-05 03:21:52") == datetime(2026, 12, 5, 3, 21, 52, tzinfo=UTC)
    assert read("2026-12-05T05:21:52+02:00") == datetime(2026, 12, 5, 3, 21, 52, tzinfo=UTC)
    assert read(None) is None


def test_a_naive_time_is_refused_on_sqlite_as_elsewhere() -> None:
    with pytest.raises(ValueError, match="naive"):
        UTCDateTime().bind_processor(SQLITE)(datetime(2026, 1, 1))


def test_json_that_orjson_refuses_is_read_as_json_reads_it() -> None:
    """NaN and integers past 64 bits (which orjson would make floats): an older version
    may have written them, and a module's answer may hold such a number."""
    assert math.isnan(json_loads('{"rate": NaN}')["rate"])
    for big in (2**63, 2**64 + 1, -(2**63) - 1, 123456789012345678901234567890):
        assert json_loads(f'{{"serial": {big}}}') == {"serial": big}
        assert json_loads(f"[{big}]".encode()) == [big]
    assert json_loads('{"ref": "12345678901234567890123", "x": 1.5}') == {"ref": "12345678901234567890123", "x": 1.5}
    assert json_loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    with pytest.raises(json.JSONDecodeError, match="property name"):
        json_loads("{not json")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()  # NaN and the infinities too
    | st.text(alphabet=st.characters(exclude_categories=())),  # lone surrogates too
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_a_json_column_is_written_so_that_it_reads_back_as_json_would_have_written_it(value: object) -> None:
    """orjson writes what it can say exactly, json the rest (NaN, an integer past 64 bits, a
    lone surrogate): whichever wrote it, the text reads back as json's own text does, and
    NaN is refused where json refuses it."""
    expected = json.dumps(json.loads(json.dumps(value)))
    assert json.dumps(json_loads(json_dumps(value))) == expected
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        with pytest.raises(ValueError, match="not JSON compliant"):
            json_dumps(value, allow_nan=False)
    else:
        assert json_dumps(value, allow_nan=False) == json_dumps(value)


def test_a_json_column_refuses_what_json_refuses_and_keeps_what_orjson_would_change() -> None:
    @dataclass
    class Thing:
        name: str

    for refused in (datetime(2026, 1, 1, tzinfo=UTC), Thing("x"), {1, 2}, b"raw"):
        with pytest.raises(TypeError):
            json_dumps({"value": refused})
    # Not strings as keys, subclasses of JSON's types: json's text, not orjson's.
    assert json_dumps({1: "a", "b": None}) == json.dumps({1: "a", "b": None})
    assert json_dumps(StepStatus.READY) == json.dumps(StepStatus.READY)
    # A null, in a string or not, is orjson's unless the value holds NaN or an infinity.
    assert json_dumps({"ref": "nullable", "none": None}) == '{"ref":"nullable","none":null}'
    assert json_dumps({"rate": math.inf, "none": None}) == json.dumps({"rate": math.inf, "none": None})
    assert json_dumps({"why": "NaN", "none": None}) == json.dumps({"why": "NaN", "none": None})
    assert json_dumps([1, "é", {"a": 2.5}]) == '[1,"é",{"a":2.5}]'


def test_rows_become_the_same_objects_whichever_way_they_are_made() -> None:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    at = datetime(2026, 12, 5, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(audit),
            [
                {"at": at, "actor": f"a{i}", "action": "run.start", "subject": f"run:{i}", "detail": {"i": i}}
                for i in range(3)
            ],
        )
        rows = conn.execute(select(audit).order_by(audit.c.id)).all()
        made = from_rows(AuditRow, conn.execute(select(audit).order_by(audit.c.id)))
        reordered = from_rows(AuditRow, conn.execute(select(*reversed(audit.c)).order_by(audit.c.id)))
        without = from_rows(
            AuditRow,
            conn.execute(select(audit.c.id, audit.c.at, audit.c.actor, audit.c.action, audit.c.subject)),
            detail=None,
        )
        with pytest.raises(KeyError, match="AuditRow: no column detail"):
            from_rows(
                AuditRow, conn.execute(select(audit.c.id, audit.c.at, audit.c.actor, audit.c.action, audit.c.subject))
            )
        assert from_rows(AuditRow, conn.execute(select(audit).where(audit.c.id < 0))) == []
    expected = [AuditRow(r.id, r.at, r.actor, r.action, r.subject, r.detail) for r in rows]
    assert made == reordered == expected == [from_row(AuditRow, r) for r in rows]
    assert [r.detail for r in without] == [None] * 3
    assert [r.actor for r in without] == ["a0", "a1", "a2"]
    assert made[0].detail == {"i": 0}
    assert made[0].at == at
    with pytest.raises(AttributeError):
        made[0].actor = "someone else"  # type: ignore[misc]

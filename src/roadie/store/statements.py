"""Statements that write or pick many rows, in the form each database takes best: an
INSERT that skips duplicates, many rows in one statement, a value among many."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Insert,
    Select,
    Table,
    any_,
    bindparam,
    func,
    insert,
    select,
)

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql


def insert_ignore(dialect_name: str, table: Table) -> Insert:
    """An INSERT that skips rows violating a unique key, in each database's own words.

    MariaDB's `INSERT IGNORE` would also turn other errors (a NULL into a NOT NULL
    column, a value too long) into warnings; `ON DUPLICATE KEY UPDATE id = id` skips only
    the duplicates.
    """
    if dialect_name in ("postgresql", "sqlite"):
        return _ignoring(insert(table), dialect_name)
    # `id = id` leaves the existing row exactly as it was. (`id = VALUES(id)` would not:
    # it moves the existing row to the new auto-increment id.)
    from sqlalchemy.dialects import mysql  # (not loaded until needed: 0.03 s of a CLI command's start)

    key = next(iter(table.primary_key.columns))
    return mysql.insert(table).on_duplicate_key_update({key.name: key})


def insert_rows(
    dialect_name: str, table: Table, rows: list[dict[str, Any]], *, ignore: bool = False
) -> tuple[Insert, Any]:
    """An INSERT of `rows` (one or more, with the same keys; `insert_ignore` with
    `ignore`), with the parameters to execute it with.

    On PostgreSQL the rows go as one array per column (`unnested`): the statement's text
    is the same whatever the number of rows, so psycopg parses it once and the server
    prepares it, where the row-by-row VALUES lists SQLAlchemy writes for a RETURNING make
    a new text of 12 parameters a row for each batch size (a batch of 100 resources: 8 ms
    against 4). The rows a RETURNING gives back are then in no particular order. Elsewhere
    the rows as they are, for the driver's executemany. The statement is made once for
    each table and set of keys."""
    names = tuple(rows[0])
    if dialect_name != "postgresql":
        return _inserting(dialect_name, table, names, ignore), rows
    fixed = _same_in_every_row({name: table.c[name] for name in names}, rows)
    return _inserting(dialect_name, table, names, ignore, fixed), _arrays(names, rows, fixed)


def _same_in_every_row(columns: Mapping[str, ColumnElement[Any]], rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The keys of `columns` (but the first) whose value is the same in every row, to be
    sent once rather than as an array of copies: psycopg writes an array element by
    element, in Python. The same means of one type and equal; for a JSON column, the
    same object (`1 == True` there, and `{"a": 1} == {"a": True}`)."""
    first = rows[0]
    fixed = []
    for key in list(columns)[1:]:  # the first stays an array: there are as many rows as its elements
        value = first[key]
        if isinstance(columns[key].type, JSON):
            same = all(row[key] is value for row in rows)
        else:
            kind = type(value)
            same = all(type(row[key]) is kind and row[key] == value for row in rows)
        if same:
            fixed.append(key)
    return tuple(fixed)


@cache
def _inserting(
    dialect_name: str, table: Table, names: tuple[str, ...], ignore: bool, fixed: tuple[str, ...] = ()
) -> Insert:
    if dialect_name != "postgresql":
        return insert_ignore(dialect_name, table) if ignore else table.insert()
    source = unnested({name: table.c[name] for name in names}, fixed=fixed)
    statement = insert(table).from_select(list(names), source)
    return _ignoring(statement, dialect_name) if ignore else statement


@cache
def _do_nothing(dialect_name: str) -> Any:
    """`ON CONFLICT DO NOTHING`, with no target, that SQLAlchemy's compiled cache can hold.
    The dialects' own ON CONFLICT clauses (and their INSERTs) have no cache key, so every
    statement holding one was compiled again at each execution: 0.6-1.5 ms for a drain's
    INSERTs, several a batch. Nothing in this one varies: one key does for all. Made when
    first used, as the dialect's module is loaded only for the database in use
    (PostgreSQL's is some 0.04 s of a command's start)."""
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql.dml import OnConflictDoNothing
    else:
        from sqlalchemy.dialects.sqlite.dml import OnConflictDoNothing  # type: ignore[assignment]
    # No internals to traverse: its cache key is its class.
    return type(f"{dialect_name}DoNothing", (OnConflictDoNothing,), {"_traverse_internals": []})


def _ignoring(statement: Insert, dialect_name: str) -> Insert:
    """`statement`, a plain INSERT just made, skipping rows that violate a unique key: the
    clause the dialect's `on_conflict_do_nothing` sets, in its cacheable form."""
    statement._post_values_clause = _do_nothing(dialect_name)()
    return statement


def many_rows(dialect_name: str, columns: Mapping[str, ColumnElement[Any]], fixed: Collection[str] = ()) -> Any:
    """What an UPDATE of many rows, each with its own values, reads them from: `source`,
    where `source[key]` stands for each row's value of `key` (`many_rows_params` gives
    the rows to execute it with, and `fixed`). On PostgreSQL a table unnested from one
    array per key, but for the keys `fixed`, whose one value goes for every row
    (`UPDATE ... FROM`), one statement of fixed text; elsewhere bind parameters, for the
    driver's executemany. Made once, a statement built on it is used again and again."""
    if dialect_name == "postgresql":
        return unnested(columns, fixed=fixed).subquery("source").c
    return {key: bindparam(key) for key in columns}


def many_rows_params(
    dialect_name: str, columns: Mapping[str, ColumnElement[Any]], rows: list[dict[str, Any]]
) -> tuple[tuple[str, ...], dict[str, Any] | list[dict[str, Any]]]:
    """The keys whose value is the same in every row (on PostgreSQL), and the parameters
    to execute a statement built on `many_rows(columns, fixed)` with."""
    if dialect_name != "postgresql":
        return (), rows
    fixed = _same_in_every_row(columns, rows)
    return fixed, _arrays(columns, rows, fixed)


def _arrays(columns: Iterable[str], rows: list[dict[str, Any]], fixed: tuple[str, ...]) -> dict[str, Any]:
    """`unnested`'s parameters: an array of every row's value of each key, one value of
    each key `fixed`."""
    parameters: dict[str, Any] = {f"rows_{key}": [row[key] for row in rows] for key in columns if key not in fixed}
    parameters.update((f"one_{key}", rows[0][key]) for key in fixed)
    return parameters


def unnested(columns: Mapping[str, ColumnElement[Any]], *, fixed: Collection[str] = ()) -> Select[Any]:
    """PostgreSQL: rows as a SELECT of one `unnest(array)` per key of `columns`, each array
    typed as the column its values are written to and labelled with its key, and given
    when the statement is executed as the parameter `rows_KEY`. The arrays are sent in
    binary (`dialects._configure_postgresql`). A key in `fixed` has one value for every row, the
    parameter `one_KEY`. The parameters are named: an anonymous one is named by a regular
    expression as the statement is compiled."""
    return select(
        *(
            bindparam(f"one_{key}", type_=column.type).label(key)
            if key in fixed
            else func.unnest(bindparam(f"rows_{key}", type_=_array_of(column))).label(key)
            for key, column in columns.items()
        )
    )


def one_of(dialect_name: str, column: ColumnElement[Any], values: Sequence[Any]) -> ColumnElement[bool]:
    """`column IN values`. On PostgreSQL `column = ANY(array)`: one parameter, so the
    statement's text does not change with the number of values (SQLAlchemy writes an IN
    list as one parameter a value, and psycopg parses each new text afresh)."""
    if dialect_name == "postgresql":
        return column == any_(bindparam(None, list(values), type_=_array_of(column)))
    return column.in_(values)


def one_of_param(dialect_name: str, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
    """`one_of` with its values left to the parameter `name` (a list), given when the
    statement is executed: the statement is then made once and used again and again."""
    if dialect_name == "postgresql":
        return column == any_(bindparam(name, type_=_array_of(column)))
    return column.in_(bindparam(name, expanding=True))


def _array_of(column: ColumnElement[Any]) -> postgresql.ARRAY[Any]:
    # One dimension: a value that is itself a list (a JSON column's) is one element, not
    # an inner array.
    from sqlalchemy.dialects.postgresql import ARRAY

    return ARRAY(column.type, dimensions=1)

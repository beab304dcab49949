"""SQLAlchemy's aiosqlite adapter, with one trip to aiosqlite's thread per statement.

aiosqlite runs each SQLite connection in a thread of its own, and every call into it is
a trip there and back through the event loop. SQLAlchemy's adapter makes four of them
for a statement that answers rows (open a cursor, execute, fetch, close) and three for
one that does not; here the four happen in one function on aiosqlite's thread. A web
page's read of three statements in a transaction went from 14 trips to 5.

Only `execute` and `executemany` of the ordinary (buffered) cursor change: the rows come
back whole, as SQLAlchemy's cursor fetched them anyway. Server-side cursors, errors and
everything else are the stock adapter's.

A connection never makes its file: the store makes it (in WAL) before the engine opens
it, and a file gone later must stay gone, so the worker can say it was deleted.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)

from roadie.store.blocking import read_write_uri

if TYPE_CHECKING:
    from collections.abc import Callable

# sqlite3 binds an int, a float or a str as it is; anything else, None included, it first
# offers to its adapters, and when none is registered asks the type `PrepareProtocol` for
# `__adapt__`, which raises an AttributeError and catches it: more than twice the cost of
# binding the value, for the most common parameter of all (a ledgered step binds seven
# Nones). A None registered as its own adapter is bound as NULL, as before, without the
# exception. (sqlite3's adapters are the process's, not a connection's: the same for
# every user of sqlite3 here, and what it writes is unchanged.)
sqlite3.register_adapter(type(None), cast("Callable[[None], None]", {}.get))  # a C call answering None


def _run(connection: sqlite3.Connection, operation: str, parameters: Any, many: bool) -> tuple[Any, Any, Any, int]:
    """On aiosqlite's thread: the statement, its description, its rows, and its counts."""
    cursor = connection.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        elif parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        return description, cursor.fetchall() if description else None, cursor.lastrowid, cursor.rowcount
    finally:
        cursor.close()


class _Cursor(AsyncAdapt_aiosqlite_cursor):
    __slots__ = ()

    def _trip(self, operation: Any, parameters: Any, many: bool) -> None:
        driver = self._connection
        try:
            found = self.await_(driver._execute(_run, driver._conn, operation, parameters, many))
        except Exception as error:
            self._adapt_connection._handle_exception(error)
        description, rows, lastrowid, rowcount = found
        self.description = description
        if description:
            self._rows = deque(rows)
            self.lastrowid = self.rowcount = -1
        else:
            self.lastrowid, self.rowcount = lastrowid, rowcount

    def execute(self, operation: Any, parameters: Any = None) -> None:
        self._trip(operation, parameters, many=False)

    def executemany(self, operation: Any, seq_of_parameters: Any) -> None:
        self._trip(operation, seq_of_parameters, many=True)


class _Connection(AsyncAdapt_aiosqlite_connection):
    __slots__ = ()

    def cursor(self, server_side: bool = False) -> AsyncAdapt_aiosqlite_cursor:
        return super().cursor(server_side) if server_side else _Cursor(self)


class _DBAPI(AsyncAdapt_aiosqlite_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> AsyncAdapt_aiosqlite_connection:
        if arg and not kw.get("uri") and arg[0] not in ("", ":memory:"):
            arg = (read_write_uri(Path(arg[0])), *arg[1:])  # opened read-write, never created
            kw["uri"] = True
        stock = super().connect(*arg, **kw)  # the driver's connection, opened as the stock adapter does
        return _Connection(self, stock._connection)


def dbapi() -> AsyncAdapt_aiosqlite_dbapi:
    """The module to give SQLAlchemy's aiosqlite dialect (`create_engine(module=...)`)."""
    return _DBAPI(aiosqlite, sqlite3)

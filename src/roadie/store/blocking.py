"""A SQLite engine that blocks, behind the few awaitables of SQLAlchemy's `AsyncEngine`
that the store calls, so that the store's queries run on it unchanged.

For a command that reads a SQLite file and exits (`roadie run list`): nothing else waits
on its event loop, so the thread aiosqlite runs each connection in buys nothing, while
loading SQLAlchemy's asyncio extension (which loads its ORM) and aiosqlite costs about
0.05 s of CPU at every start. A long-lived process (a worker, the web server) keeps the
asyncio engine: there a blocking call would hold up every other task.

The engine is SQLAlchemy's own pysqlite engine, set up as the asyncio one is (the same
PRAGMAs and BEGINs, `dialects.configure_sqlite`) and opening its file read-write, never
creating it (`open_sqlite_file`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine, Result
    from sqlalchemy.engine import URL, Dialect


class BlockingConnection:
    """One connection of a `BlockingEngine`, answering what `AsyncConnection` answers."""

    def __init__(self, connection: Connection) -> None:
        self.sync_connection = connection

    @property
    def info(self) -> dict[Any, Any]:
        return self.sync_connection.info

    @property
    def dialect(self) -> Dialect:
        return self.sync_connection.dialect

    async def execute(self, statement: Any, parameters: Any = None, **kw: Any) -> Result[Any]:
        return self.sync_connection.execute(statement, parameters, **kw)

    async def exec_driver_sql(self, statement: str, parameters: Any = None, **kw: Any) -> Result[Any]:
        return self.sync_connection.exec_driver_sql(statement, parameters, **kw)

    async def scalar(self, statement: Any, parameters: Any = None, **kw: Any) -> Any:
        return self.sync_connection.scalar(statement, parameters, **kw)

    async def run_sync(self, fn: Any, *args: Any, **kw: Any) -> Any:
        return fn(self.sync_connection, *args, **kw)

    async def execution_options(self, **options: Any) -> Self:
        self.sync_connection.execution_options(**options)
        return self

    def get_execution_options(self) -> Any:
        return self.sync_connection.get_execution_options()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[Self]:
        with self.sync_connection.begin():
            yield self

    @asynccontextmanager
    async def begin_nested(self) -> AsyncIterator[Self]:
        with self.sync_connection.begin_nested():
            yield self


class BlockingEngine:
    """A synchronous `Engine`, answering what `AsyncEngine` answers."""

    def __init__(self, engine: Engine) -> None:
        self.sync_engine = engine

    @property
    def url(self) -> URL:
        return self.sync_engine.url

    @property
    def dialect(self) -> Dialect:
        return self.sync_engine.dialect

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[BlockingConnection]:
        with self.sync_engine.connect() as connection:
            yield BlockingConnection(connection)

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[BlockingConnection]:
        with self.sync_engine.begin() as connection:
            yield BlockingConnection(connection)

    async def dispose(self) -> None:
        self.sync_engine.dispose()


def read_write_uri(path: Path) -> str:
    """The URI that opens a SQLite file read-write and never creates it (this engine's and
    the aiosqlite driver's): a new connection of a worker whose file was deleted made an
    empty one in its place, which then read as "replaced"."""
    return f"{path.absolute().as_uri()}?mode=rw"


def open_sqlite_file(path: Path) -> sqlite3.Connection:
    """A blocking connection to the SQLite file at `path`, opened read-write."""
    return sqlite3.connect(read_write_uri(path), uri=True, check_same_thread=False)

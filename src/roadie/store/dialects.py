"""The narrow places where databases differ. Everything else is portable Core."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Insert, Table, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}


def async_url(url: str) -> str:
    """The URL an operator writes (`sqlite:///roadie.db`) as the async driver's URL."""
    parsed = make_url(url)
    if "+" in parsed.drivername:
        return url
    driver = ASYNC_DRIVERS.get(parsed.get_backend_name())
    return parsed.set(drivername=driver).render_as_string(hide_password=False) if driver else url


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    engine = create_async_engine(async_url(url), **kwargs)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: AsyncEngine) -> None:
    # pysqlite's own transaction handling begins lazily and as DEFERRED, so two writers
    # can both read and then deadlock on the upgrade to a write lock. Take the write
    # lock at BEGIN instead; with WAL, readers are never blocked by it.
    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def insert_ignore(dialect_name: str, table: Table) -> Insert:
    """An INSERT that skips rows violating a unique key, in each database's own words."""
    if dialect_name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    if dialect_name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return table.insert().prefix_with("IGNORE")

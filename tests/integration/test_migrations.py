"""The migrations create exactly the schema `tables.py` describes, on every database."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection
from tests.conftest import Harness
from tests.databases import PLANTED_PASSWORD, Database

from roadie.errors import StoreError
from roadie.store import Store, dialects, migrate
from roadie.store.tables import metadata


def _differences(connection: Any) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": False})
    diff = compare_metadata(context, metadata)
    # MariaDB's live-target key is an index on a generated column the metadata does not
    # spell the same way (tables.py says why); everything else must match.
    return [d for d in diff if "live" not in repr(d)]


def test_migrations_match_the_tables(harness: Harness) -> None:
    async def body() -> None:
        async with harness.store.engine.connect() as conn:
            assert await conn.run_sync(_differences) == []

    harness.run(body)


def test_a_connection_the_server_drops_while_the_store_opens_is_made_again(
    tmp_path: Path, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that starts while its database server is restarting (CI saw the server
    drop the connection that read `alembic_version`) reconnects and opens, as every other
    read and write of the store does, instead of exiting with a traceback."""
    if database.backend == "sqlite":
        pytest.skip("a file has no connection to drop")
    url = database.fresh(tmp_path)
    dropped: list[str] = []
    upgrade = migrate.upgrade

    def dropped_once(connection: Connection) -> None:
        if not dropped:
            dropped.append(connection.dialect.name)
            kill = (
                "SELECT pg_terminate_backend(pg_backend_pid())"
                if database.dialect == "postgresql"
                else "KILL CONNECTION_ID()"
            )
            connection.exec_driver_sql(kill)
        upgrade(connection)

    monkeypatch.setattr(migrate, "upgrade", dropped_once)

    async def main() -> None:
        store = await Store.open(url)
        try:
            async with store.engine.connect() as conn:
                version = (await conn.exec_driver_sql("SELECT version_num FROM alembic_version")).scalars().all()
            assert len(version) == 1
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        database.drop_all()
    assert dropped


def test_a_read_on_sqlite_neither_waits_for_a_writer_nor_holds_one_up(tmp_path: Path) -> None:
    """Reads begin DEFERRED and read WAL's snapshot: a write transaction held open by
    another process does not keep `run list` (or the run page) waiting for the 30 s busy
    timeout, and a read open meanwhile does not keep the writer from committing."""
    url = f"sqlite:///{tmp_path / 'roadie.db'}"

    async def main() -> None:
        store = await Store.open(url)
        try:
            writer = sqlite3.connect(tmp_path / "roadie.db", isolation_level=None)
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("INSERT INTO audit (at, actor, action, subject) VALUES ('2026-01-01', 'x', 'y', 'z')")
            assert await asyncio.wait_for(store.list_audit(), timeout=10) == []
            writer.execute("COMMIT")
            writer.close()
            assert [a.actor for a in await store.list_audit()] == ["x"]
        finally:
            await store.close()

    asyncio.run(main())


def test_a_migration_lock_held_too_long_is_one_line_naming_its_holder(
    tmp_path: Path, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a process started while another session held the migration lock waited
    without a word, for ever on PostgreSQL (on MariaDB 300 s, then 'check that its server
    is up'). Now, after a few seconds' quiet wait (processes starting together wait a
    moment for each other's migrations), it says once that it waits, and after the wait
    names the session holding the lock and how to end it, exit 69; once the lock is given
    back it opens."""
    if database.backend == "sqlite":
        pytest.skip("SQLite's migrations wait on its write lock, which its busy timeout bounds")
    url = database.fresh(tmp_path)
    monkeypatch.setattr(migrate, "MIGRATION_LOCK_WAIT", 1.5)
    monkeypatch.setattr(migrate, "MIGRATION_LOCK_WAIT_QUIETLY", 0.5)  # then it says it waits
    # The schema is not there yet: the open takes the lock to make it (one that finds the
    # schema at the newest migration has nothing to make, and opens without it).

    async def held_while_opening() -> tuple[int, str]:
        holder = dialects.create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            async with holder.connect() as conn:
                pid = await _hold_migration_lock(conn, url)
                with pytest.raises(StoreError) as refused:
                    await Store.open(url)
                return pid, str(refused.value)
        finally:
            await holder.dispose()

    pid, message = asyncio.run(held_while_opening())
    assert f"session {pid} " in message, message
    end = f"SELECT pg_terminate_backend({pid})" if database.dialect == "postgresql" else f"KILL {pid}"
    assert end in message, message
    assert message.startswith("cannot migrate the database"), message
    assert PLANTED_PASSWORD not in message
    asyncio.run(_close(Store.open(url)))


def test_a_migration_lock_guards_its_own_database_only(
    tmp_path: Path, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: MariaDB's migration lock was one name for the whole server, so a process
    migrating one database held up every other database's (and a session holding it for
    one failed the opening of all). Now each database has its own, as PostgreSQL's
    advisory locks are a database's."""
    if database.backend == "sqlite":
        pytest.skip("a SQLite file is its own lock")
    held, other = database.fresh(tmp_path), database.fresh(tmp_path)
    monkeypatch.setattr(migrate, "MIGRATION_LOCK_WAIT", 1.5)
    monkeypatch.setattr(migrate, "MIGRATION_LOCK_WAIT_QUIETLY", 0.5)

    async def main() -> None:
        holder = dialects.create_engine(held, isolation_level="AUTOCOMMIT")
        try:
            async with holder.connect() as conn:
                await _hold_migration_lock(conn, held)
                await _close(Store.open(other))
                with pytest.raises(StoreError, match="migration lock"):
                    await Store.open(held)
        finally:
            await holder.dispose()

    asyncio.run(main())


async def _hold_migration_lock(conn: AsyncConnection, url: str) -> int:
    """Take the migration lock of the database at `url` on `conn`, as a migrating process
    would; answers the session's id."""
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql("BEGIN")
        await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(x'726F6164'::int)")
        return int((await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one())
    lock = migrate.migration_lock_name(make_url(url).database)
    assert (await conn.exec_driver_sql(f"SELECT GET_LOCK('{lock}', 0)")).scalar() == 1
    return int((await conn.exec_driver_sql("SELECT CONNECTION_ID()")).scalar_one())


async def _close(opening: Any) -> None:
    await (await opening).close()


def test_a_connection_dropped_during_the_migrations_is_made_again(
    tmp_path: Path, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: on MariaDB, a worker whose connection the server dropped while it migrated
    (a server restarting as the worker starts; seen in CI under the fault suite) died with
    SQLAlchemy's 'Can't reconnect until invalid transaction is rolled back': giving the
    migration lock back on the dead connection failed and hid why it had died, so the
    open was not tried again. Now the lock is left to the dead session (the server gives
    it back with it) and the open goes on, on a new connection."""
    if database.backend == "sqlite":
        pytest.skip("a file has no connection to drop")
    url = database.fresh(tmp_path)
    real = command.upgrade
    dropped: list[int] = []

    def drop_own_connection_once(config: Any, revision: str) -> None:
        connection: Connection = config.attributes["connection"]
        if not dropped:
            own = "SELECT pg_backend_pid()" if database.dialect == "postgresql" else "SELECT CONNECTION_ID()"
            dropped.append(int(connection.exec_driver_sql(own).scalar_one()))
            end = "SELECT pg_terminate_backend({})" if database.dialect == "postgresql" else "KILL {}"
            connection.exec_driver_sql(end.format(dropped[0]))
        real(config, revision)

    monkeypatch.setattr(command, "upgrade", drop_own_connection_once)
    asyncio.run(_close(Store.open(url)))
    assert dropped, "the migration never ran"
    monkeypatch.setattr(command, "upgrade", real)
    monkeypatch.setattr(migrate, "at_head", lambda connection: False)  # as an open with a migration to make
    asyncio.run(_close(Store.open(url)))  # the lock was given back: a later open takes it


def test_the_newest_migration_is_the_one_alembic_finds() -> None:
    """`migrate.head`, read from the migration files so that a database at the newest
    migration opens without loading Alembic, names the revision Alembic finds newest."""
    assert migrate.head() == ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()

"""The migrations create exactly the schema `tables.py` describes, on every database."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection
from tests.conftest import Harness
from tests.databases import Database

from roadie.store import Store, migrate
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

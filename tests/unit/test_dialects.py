"""What Roadie makes of an operator's database URL before the driver sees it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from psycopg.adapt import PyFormat
from psycopg.types.json import Json
from sqlalchemy import event
from sqlalchemy.engine import make_url
from tests.databases import SERVERS, check_reachable

from roadie.errors import ConfigError
from roadie.store import Store, dialects


async def _threshold(url: str) -> object:
    engine = dialects.create_engine(url)
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            return raw.driver_connection.prepare_threshold  # type: ignore[union-attr]
    finally:
        await engine.dispose()


@pytest.mark.parametrize(("query", "threshold"), [("none", None), ("0", 0), ("10", 10), (None, 5)])
def test_prepare_threshold_in_the_url_reaches_psycopg_as_its_own_parameter(
    query: str | None, threshold: object
) -> None:
    """`?prepare_threshold=none` (what a pooler in transaction mode needs) is taken out of
    the URL, which libpq would refuse, and given to psycopg as its keyword; without it,
    psycopg's own default (prepare after 5 runs) stands."""
    problem = check_reachable("postgresql")
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    url = make_url(SERVERS["postgresql"])
    if query is not None:
        url = url.update_query_dict({"prepare_threshold": query})
    assert asyncio.run(_threshold(url.render_as_string(hide_password=False))) == threshold


def test_a_prepare_threshold_that_is_neither_none_nor_a_number_is_named() -> None:
    with pytest.raises(ConfigError, match="prepare_threshold='sometimes' in the database URL"):
        dialects.create_engine("postgresql://roadie@db.internal/roadie?prepare_threshold=sometimes")


@pytest.mark.parametrize(("query", "kept"), [(str(dialects.POOL_SIZE), dialects.POOL_SIZE), ("3", 3)])
def test_a_burst_of_reads_opens_the_pools_connections_once_and_keeps_them(
    tmp_path: Path, query: str | None, kept: int
) -> None:
    """Bursts of concurrent reads, wider than the pool, wait for its connections rather
    than open (and close again) connections beyond it."""

    async def main() -> int:
        url = f"sqlite:///{tmp_path / 'roadie.db'}" + (f"?pool_size={query}" if query else "")
        store = await Store.open(url)
        opened = 0

        @event.listens_for(store.engine.sync_engine, "connect")
        def _opened(*_: object) -> None:
            nonlocal opened
            opened += 1

        try:
            for _ in range(3):
                await asyncio.gather(*(store.list_runs() for _ in range(40)))
            return opened + 1  # and the one the migrations opened, kept since
        finally:
            await store.close()

    assert asyncio.run(main()) == kept


@pytest.mark.parametrize("value", ["0", "many", "-2"])
def test_a_pool_size_that_is_not_a_count_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match=f"pool_size='{value}' in the database URL"):
        dialects.create_engine(f"sqlite:///roadie.db?pool_size={value}")


def test_postgresql_gets_array_parameters_in_binary() -> None:
    """A list goes to PostgreSQL as a binary array: psycopg's text form escapes each element
    in Python, ten times the cost of the value itself for a JSON value of a megabyte."""
    problem = check_reachable("postgresql")
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)

    async def main() -> tuple[str, str]:
        engine = dialects.create_engine(SERVERS["postgresql"])
        try:
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver: Any = raw.driver_connection
                dumper = driver.adapters.get_dumper(list, PyFormat.AUTO)
                cast = await conn.exec_driver_sql("SELECT (%(v)s::json[])[1]::text", {"v": [Json({"a": 'b"c'})]})
                return dumper.__name__, cast.scalar_one()
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == ("ListBinaryDumper", '{"a":"b\\"c"}')


def _postgresql_or_skip() -> None:
    problem = check_reachable("postgresql")
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)


@pytest.mark.parametrize(
    ("url", "read"),
    [
        (
            "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
            "postgresql://u@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
        ),
        ("postgresql://u:p@h1,h2/db", "postgresql://u:p@/db?host=h1,h2"),
        ("postgresql://u@[::1]:5432,h2:5432/db", "postgresql://u@/db?host=::1,h2&port=5432,5432"),
        ("postgres://u:p@h:5432/db", "postgresql://u:p@h:5432/db"),
        ("postgres+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h1,h2/db", "postgresql://u@/db?host=h1,h2"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("mysql://root@h:3306/db", "mysql://root@h:3306/db"),
        ("sqlite:///roadie.db", "sqlite:///roadie.db"),
    ],
)
def test_libpq_forms_of_a_postgresql_url_are_read_as_libpq_reads_them(url: str, read: str) -> None:
    """Several hosts in libpq's comma form, and the scheme `postgres://` that hosting
    providers hand out, are what SQLAlchemy reads; they were a ValueError traceback and
    'no database Roadie can use'."""
    assert dialects.normal_url(url) == read
    assert dialects.parse_url(url).get_backend_name() in ("postgresql", "mysql", "sqlite")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u@h1:port,h2/db", "host 'h1:port' is not host:port"),
        ("postgresql://u@h1,h2/db?host=h3", "gives its hosts twice"),
        ("postgresql://u:planted@h:notaport/db", "is not a database URL"),
    ],
)
def test_a_url_whose_hosts_cannot_be_read_is_named_without_its_password(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        dialects.create_engine(url)
    assert "planted" not in caught.value.message


def test_several_hosts_are_tried_in_order_the_first_down() -> None:
    """With the first host refusing connections, the second is connected to, and
    `target_session_attrs` reaches libpq."""
    _postgresql_or_skip()
    server = make_url(SERVERS["postgresql"])
    url = server.render_as_string(hide_password=False).replace(
        f"@{server.host}:{server.port}/", f"@127.0.0.1:1,{server.host}:{server.port}/"
    )
    assert "127.0.0.1:1," in url, "the first host is the one that refuses"

    async def main() -> tuple[str, bool]:
        engine = dialects.create_engine(url + "?target_session_attrs=read-write")
        try:
            async with engine.connect() as conn:
                found = await conn.exec_driver_sql("SELECT current_database(), pg_is_in_recovery()")
                name, standby = found.one()
                return name, standby
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == (server.database, False)


def test_a_deleted_sqlite_file_is_never_made_again_by_a_new_connection(tmp_path: Path) -> None:
    """A worker's look at its runs opened a new connection after the file was deleted,
    which made an empty file in its place: the worker then said "replaced" for "deleted",
    and left a database nobody had made. (A space in the path, which a URI escapes.)"""

    async def main(path: Path) -> str | None:
        store = await Store.open(f"sqlite:///{path}")
        try:
            os.unlink(path)
            await store.engine.dispose()  # the pool's connections gone: the next read opens one
            with pytest.raises(Exception, match="unable to open database file"):
                await store.list_runs()
            return store.file_lost()
        finally:
            await store.close()

    for name in ("roadie.db", "a name with spaces.db"):
        path = tmp_path / name
        assert asyncio.run(main(path)) == f"the database file {path} was deleted"
        assert not path.exists()


def test_a_command_that_reads_sqlite_reads_what_the_worker_wrote_with_a_blocking_engine(tmp_path: Path) -> None:
    """`roadie run list` and the other listings read a SQLite file with a blocking engine
    (`roadie.store.blocking`): the same rows, times and JSON as the asyncio engine, the
    same PRAGMAs, a read that sees a writer's committed rows only, and never a file made."""
    from datetime import UTC, datetime

    path = tmp_path / "roadie.db"
    url = f"sqlite:///{path}"
    when = datetime(2026, 12, 7, 16, 30, 1, 123456, tzinfo=UTC)

    async def main() -> None:
        writer = await Store.open(url)
        reader = await Store.open(url, blocking=True)
        try:
            assert type(reader.engine).__name__ == "BlockingEngine"
            await writer.write_audit(when, "ana", "run.cancel", "run:7", {"why": ["late", 3]})
            [seen] = await reader.list_audit()
            assert (seen.at, seen.actor, seen.action, seen.subject, seen.detail) == (
                when,
                "ana",
                "run.cancel",
                "run:7",
                {"why": ["late", 3]},
            )

            async def pragmas(conn: Any) -> tuple[Any, ...]:
                read = [(await conn.exec_driver_sql(f"PRAGMA {p}")).scalar() for p in ("busy_timeout", "journal_mode")]
                return (*read, (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar())

            assert await reader._read(pragmas) == await writer._read(pragmas)

            os.unlink(path)
            await reader.engine.dispose()
            with pytest.raises(Exception, match="unable to open database file"):
                await reader.list_audit()
            assert not path.exists()
        finally:
            await reader.close()
            await writer.close()

    asyncio.run(main())

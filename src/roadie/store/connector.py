"""The connector: one database, its transactions, reconnects and retries, and the write
points the crash tests hook into. Every query module of the store is built on it.

`write_point` is the fault hook of the crash tests: it is called with a name just before
each write transaction commits, and whatever it raises aborts that transaction.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import event, select
from sqlalchemy.exc import DBAPIError

from roadie.errors import StoreError
from roadie.log import get_logger
from roadie.store import dialects, migrate
from roadie.store.tables import UTCDateTime

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
    from sqlalchemy.pool import ConnectionPoolEntry

log = get_logger(__name__)

WritePoint = Callable[[str], None]
TRANSIENT_ATTEMPTS = 8
# Lost connections are tried again for about ten seconds (pauses of 0.05 s doubling up to
# 2 s): long enough for a database server to restart, short enough to report a dead one.
CONNECTION_ATTEMPTS = 10
RECONNECT_MAX_DELAY = 2.0
_CHUNK = 400  # bound on bind parameters per statement, well inside every database's limit
_AFTER_COMMIT = "roadie.after_commit"  # in a write transaction's `conn.info`: see `after_commit`


def chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def after_commit(conn: AsyncConnection, done: Callable[[], None]) -> None:
    """Call `done` once the write transaction `conn` is in has committed, and not if it
    does not: for what a process may remember only of what the database has kept."""
    conn.info[_AFTER_COMMIT].append(done)


def aware(value: Any) -> datetime | None:
    if value is None:
        return None
    return UTCDateTime().process_result_value(value, None)  # type: ignore[arg-type]


class Connector:
    def __init__(self, engine: AsyncEngine, *, write_point: WritePoint | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.write_point: WritePoint = write_point or (lambda name: None)
        self.active = 0  # database calls under way, for callers (tests) that must know
        # Since when connections have been lost without one made again: an outage is said
        # when it begins and when it ends, not at every read that meets it.
        self._lost_since: float | None = None
        self._file: tuple[str, int, int] | None = None  # a SQLite file's path, device and inode
        self._closed = False
        event.listen(engine.sync_engine, "checkin", self._checked_in)

    @classmethod
    async def open(cls, url: str, *, migrate_schema: bool = True, **kwargs: Any) -> Self:
        """Open the database at `url`, applying migrations first unless told not to.

        A database that cannot be reached or refuses us is a `StoreError` of one line
        naming it (without its password) and why, raised at once: there is nothing to
        wait for when nothing was ever connected."""
        engine = dialects.create_engine(url, **kwargs)
        missing = dialects.missing_folder(engine.url)
        if missing is not None:
            await engine.dispose()
            raise StoreError(
                f"cannot open the database {dialects.redacted(engine.url)}: its folder "
                f"{missing} does not exist; create it, or correct the URL "
                "(--database-url, ROADIE_DATABASE_URL or roadie.toml)"
            )
        store = cls(engine)
        if migrate_schema:
            try:
                await asyncio.to_thread(dialects.journal_file_to_wal, engine.url)
                await store.migrate()
            except migrate.MigrationLockHeld as exc:
                await engine.dispose()
                raise StoreError(f"cannot migrate the database {dialects.redacted(engine.url)}: {exc}") from exc
            except (DBAPIError, OSError, sqlite3.Error) as exc:
                await engine.dispose()
                where = "its folder exists and may be written" if store.dialect == "sqlite" else "its server is up"
                raise StoreError(
                    f"cannot open the database {dialects.redacted(engine.url)}: "
                    f"{dialects.describe_failure(exc)}; check that {where}, and the URL "
                    "(--database-url, ROADIE_DATABASE_URL or roadie.toml)"
                ) from exc
        store._file = dialects.file_identity(engine.url)
        return store

    def file_lost(self) -> str | None:
        """For a SQLite database, why its file is no longer the one opened (deleted, or
        replaced by another), else None. SQLite carries on in a deleted file unawares,
        and a worker would then work in a database nobody else can see."""
        if self._file is None:
            return None
        path, device, inode = self._file
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return f"the database file {path} was deleted"
        if (now.st_dev, now.st_ino) != (device, inode):
            return f"the database file {path} was replaced by another file"
        return None

    async def migrate(self) -> None:
        """Bring the schema to the newest migration. A connection the server drops (it is
        restarting as a worker starts) is made again, as for any read: the migrations read
        where the schema stands first, so none is applied twice. A server that cannot be
        reached at all is reported at once."""
        lost = 0
        while True:
            try:
                async with self.engine.begin() as conn:
                    await conn.run_sync(migrate.upgrade)
                return
            except DBAPIError as exc:
                lost_only = not dialects.is_unreachable(self.dialect, exc)
                if lost_only and lost < CONNECTION_ATTEMPTS and dialects.is_connection_lost(self.dialect, exc):
                    lost += 1
                    await self._reconnect_pause("migrate", lost, exc)
                    continue
                raise

    async def close(self) -> None:
        """Close every connection. One still in use (a task finishing its transaction as the
        owner closes the store) is closed when it is given back: the pool would keep it, and
        a disposed pool is never looked at again, so nothing would ever close it."""
        self._closed = True
        await self.engine.dispose()

    def _checked_in(self, dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        if self._closed:
            log.debug("connection given back after the store closed", dialect=self.dialect)
            record.close()

    # -- plumbing -------------------------------------------------------------------

    async def _write(self, name: str, work: Callable[[AsyncConnection], Any]) -> Any:
        """Run `work` in one write transaction, passing the named write point before commit.

        A deadlock or serialisation failure is the database asking for the transaction
        again; it is run again, a few times, before it becomes a `StoreError`. So is a
        connection lost before the commit was sent (the server restarted, the backend was
        killed): nothing of the transaction was kept, and a new connection is tried with
        a growing pause, for as long as a server restart takes. A connection lost *during*
        the commit is not run again: whether it committed is unknown, and the caller (who
        knows whether doing it twice is harmless) decides.
        """
        attempt = lost = 0
        while True:
            committing = False
            committed: list[Callable[[], None]] = []
            try:
                self.active += 1
                async with self.engine.connect() as conn:
                    conn.info[_AFTER_COMMIT] = committed  # (a failed transaction's list is left, unused)
                    async with conn.begin():
                        result = await work(conn)
                        self.write_point(name)
                        committing = True
                for done in committed:
                    done()
                if self._lost_since is not None:
                    self._connected_again()
                return result
            except DBAPIError as exc:
                if not committing and lost < CONNECTION_ATTEMPTS and dialects.is_connection_lost(self.dialect, exc):
                    lost += 1
                    await self._reconnect_pause(name, lost, exc)
                    continue
                attempt += 1
                if attempt < TRANSIENT_ATTEMPTS and dialects.is_transient(self.dialect, exc):
                    # Jittered, so that the workers that deadlocked do not meet again.
                    await asyncio.sleep(random.uniform(0, 0.02 * attempt))
                    continue
                if committing and dialects.is_connection_lost(self.dialect, exc):
                    raise StoreError(f"{name}: the connection was lost while committing: {exc.orig}") from exc
                raise StoreError(f"{name}: {exc.orig}") from exc
            finally:
                self.active -= 1

    async def _read(self, work: Callable[[AsyncConnection], Any], *, one_statement: bool = False) -> Any:
        """Run `work`, which only reads. Its statements read one snapshot; `one_statement`
        says it runs just one, which on SQLite then needs no transaction of its own (the
        hot reads of every web request: a token, a session, a run)."""
        lost = 0
        while True:
            self.active += 1
            try:
                async with self.engine.connect() as conn:
                    await conn.execution_options(**{dialects.READ_ONLY: True, dialects.ONE_STATEMENT: one_statement})
                    result = await work(conn)
                if self._lost_since is not None:
                    self._connected_again()
                return result
            except DBAPIError as exc:
                # A read changes nothing: after a lost connection it is always safe again.
                if lost < CONNECTION_ATTEMPTS and dialects.is_connection_lost(self.dialect, exc):
                    lost += 1
                    await self._reconnect_pause("read", lost, exc)
                    continue
                raise StoreError(str(exc.orig)) from exc
            finally:
                self.active -= 1

    async def _reconnect_pause(self, name: str, lost: int, exc: DBAPIError) -> None:
        delay = min(RECONNECT_MAX_DELAY, 0.05 * 2 ** (lost - 1)) * random.uniform(0.5, 1.0)
        said = log.debug if self._lost_since is not None else log.warning
        if self._lost_since is None:
            self._lost_since = time.monotonic()
        said("database connection lost; reconnecting", write=name, attempt=lost, error=str(exc.orig)[:200])
        await asyncio.sleep(delay)

    def _connected_again(self) -> None:
        assert self._lost_since is not None
        log.warning("database connection made again", after=f"{time.monotonic() - self._lost_since:.1f}s")
        self._lost_since = None

    async def ping(self) -> None:
        """One round trip to the database, for health checks."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(select(1))

        await self._read(work)

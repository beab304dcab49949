"""Apply the schema migrations (`roadie init`, and every engine start), one process at a
time under a database-wide lock."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, inspect
from sqlalchemy.exc import DBAPIError

from roadie.errors import StoreError
from roadie.log import get_logger
from roadie.store.dialects import MYSQL_FAMILY

if TYPE_CHECKING:
    from alembic.config import Config

log = get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection) -> None:
    """Bring the database on `connection` to the newest schema. Idempotent, and safe for
    many processes at once: they take turns under a database lock, and each after the
    first finds nothing left to do.

    A database already at the newest migration is found so by one read, before the lock
    and without Alembic, which costs a tenth of a second of CPU to load and read its
    migrations: every command opens the store, `roadie run list` included."""
    if at_head(connection):
        return
    from alembic import command

    release = lock_for_migration(connection)
    try:
        command.upgrade(alembic_config(connection), "head")
    except BaseException:
        # A connection the server dropped took its session's lock with it; giving the lock
        # back on it would fail, and hide the drop that the caller makes a new one for.
        if not connection.invalidated:
            release()
        raise
    release()


def at_head(connection: Connection) -> bool:
    """Whether the database's schema is at the newest migration (`head`)."""
    newest = head()
    if newest is None or not inspect(connection).has_table("alembic_version"):
        return False
    return list(connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalars()) == [newest]


_REVISION = re.compile(r'^revision = "([^"]+)"$', re.MULTILINE)
_DOWN_REVISION = re.compile(r'^down_revision = (?:"([^"]+)"|None)$', re.MULTILINE)


@cache
def head() -> str | None:
    """The newest migration's revision, read from the migration files as they are written
    (`revision = "0013"`, `down_revision = "0012"`); None where they are not one line of
    revisions so written, which leaves the question to Alembic."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        text = path.read_text()
        revision, down = _REVISION.search(text), _DOWN_REVISION.search(text)
        if revision is None or down is None:
            return None
        revisions.add(revision[1])
        if down[1] is not None:
            parents.add(down[1])
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and len(revisions) == len(parents) + 1 else None


# Any fixed number will do, as long as every Roadie process uses the same one.
_MIGRATION_LOCK = 0x726F6164  # "road"
MIGRATION_LOCK_WAIT = 300.0  # seconds a process waits for another's migration before it gives up
MIGRATION_LOCK_WAIT_QUIETLY = 5.0  # seconds of that it waits before it says it is waiting


class MigrationLockHeld(StoreError):
    """Another session has held the migration lock for longer than `MIGRATION_LOCK_WAIT`."""


def lock_for_migration(connection: Connection) -> Callable[[], None]:
    """Take the database-wide lock that lets one process at a time migrate the schema,
    waiting for it; answer how to give it back. Workers started together would otherwise
    race on the same DDL (and MariaDB's DDL is not transactional, so a loser can leave a
    half-made schema). PostgreSQL: an advisory lock held until the transaction ends.
    MariaDB: a named lock held by the session. SQLite: the write lock its BEGIN IMMEDIATE
    took already.

    A lock another session holds is waited for, saying so once after a few seconds, for
    `MIGRATION_LOCK_WAIT` seconds at most; then `MigrationLockHeld` names the holder and
    how to end it (a process stopped half way through a migration holds it until its
    session ends)."""
    name = connection.dialect.name
    # A few seconds' wait is processes starting together; past that, it is said.
    patience = min(MIGRATION_LOCK_WAIT_QUIETLY, MIGRATION_LOCK_WAIT)
    waits = [w for w in (patience, MIGRATION_LOCK_WAIT - patience) if w > 0]
    last = len(waits) - 1
    holder: dict[str, Any] | None = None
    if name == "postgresql":
        for i, wait in enumerate(waits):
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(wait * 1000)}ms'")
            try:
                with connection.begin_nested():  # a savepoint: the holder can be looked up after a timeout
                    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                    raise
                holder = _migration_lock_holder(connection) or holder
                if i < last:
                    log.warning("waiting for the migration lock", holder=holder, wait_s=MIGRATION_LOCK_WAIT)
                continue
            connection.exec_driver_sql("SET LOCAL lock_timeout TO DEFAULT")
            return lambda: None
        raise _held(holder, "SELECT pg_terminate_backend({pid})")
    if name in MYSQL_FAMILY:
        lock = migration_lock_name(connection.engine.url.database)
        for i, wait in enumerate(waits):
            if connection.exec_driver_sql(f"SELECT GET_LOCK('{lock}', {math.ceil(wait)})").scalar() == 1:
                return lambda: connection.exec_driver_sql(f"SELECT RELEASE_LOCK('{lock}')").close()
            holder = _migration_lock_holder(connection) or holder
            if i < last:
                log.warning("waiting for the migration lock", holder=holder, wait_s=MIGRATION_LOCK_WAIT)
        raise _held(holder, "KILL {pid}")
    return lambda: None


def migration_lock_name(database: str | None) -> str:
    """MariaDB's migration lock. A named lock is the server's, not a database's (where
    PostgreSQL's advisory locks are a database's): its name says which database it guards,
    hashed to keep within the 64 characters a name may have."""
    return "roadie.migrate." + hashlib.sha256((database or "").encode()).hexdigest()[:40]


def _migration_lock_holder(connection: Connection) -> dict[str, Any] | None:
    """Who holds the migration lock, as the server knows them (None: nobody now)."""
    if connection.dialect.name == "postgresql":
        row = connection.exec_driver_sql(
            "SELECT a.pid, host(a.client_addr), a.application_name, a.state,"
            " round(extract(epoch FROM clock_timestamp() - a.xact_start))::int"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            f" WHERE l.locktype = 'advisory' AND l.granted AND l.objid = {_MIGRATION_LOCK} AND l.classid = 0"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).first()
        if row is None:
            return None
        pid, client, application, state, held = row
        return {"pid": pid, "from": client or "a local socket", "application": application, "state": state,
                "held_s": held}  # fmt: skip
    row = connection.exec_driver_sql(
        "SELECT p.id, p.host, p.command, p.time FROM information_schema.processlist p"
        f" WHERE p.id = IS_USED_LOCK('{migration_lock_name(connection.engine.url.database)}')"
    ).first()
    if row is None:
        return None
    pid, client, command, held = row
    return {"pid": pid, "from": client, "state": command, "held_s": held}


def _held(holder: dict[str, Any] | None, how_to_end: str) -> MigrationLockHeld:
    if holder is None:
        return MigrationLockHeld(
            f"the migration lock was held by another session for {MIGRATION_LOCK_WAIT:.0f} s; try again"
        )
    return MigrationLockHeld(
        f"session {holder['pid']} (from {holder['from']}, {holder['state']} for {holder['held_s']} s) has held "
        f"Roadie's migration lock for over {MIGRATION_LOCK_WAIT:.0f} s: another process is migrating the schema, "
        f"or stopped half way. Wait for it, or stop that process, or end its session ({how_to_end.format(**holder)})"
    )

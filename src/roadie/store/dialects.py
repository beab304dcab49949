"""The narrow places where databases differ. Everything else is portable Core."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    Select,
    Table,
    event,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DataError, IntegrityError

from roadie.errors import ConfigError, StoreError
from roadie.log import get_logger
from roadie.store.json_text import json_dumps, json_loads

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

log = get_logger(__name__)

ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+asyncmy",
    "mariadb": "mysql+asyncmy",
}
MYSQL_FAMILY = ("mysql", "mariadb")
EXAMPLE_URLS = "sqlite:///roadie.db, postgresql://user@host/db or mysql://user@host/db (MariaDB)"


# Scheme, user info, and the hosts part of a URL as SQLAlchemy's own pattern reads them
# (a password holds anything but `@`); the hosts part ends at the path or the query.
_AUTHORITY = re.compile(r"^(?P<scheme>[\w+]+)://(?P<userinfo>[^:/]*(?::[^@]*)?@)?(?P<hosts>[^/?]*)(?P<rest>.*)$", re.S)


def normal_url(url: str) -> str:
    """An operator's database URL as SQLAlchemy reads it. Two forms that libpq and
    hosting providers hand out, which SQLAlchemy's `make_url` refuses, are rewritten:
    the scheme `postgres://` is `postgresql://`, and several hosts in libpq's comma form
    (`postgresql://u@h1:5432,h2:5432/db`, the first that answers, for a primary and its
    standbys) go in the query as `?host=h1,h2&port=5432,5432`, which SQLAlchemy hands
    to psycopg as one conninfo with several hosts, tried in order as libpq does
    (`target_session_attrs` then picks among them)."""
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    scheme, userinfo, hosts, rest = match.group("scheme", "userinfo", "hosts", "rest")
    if scheme == "postgres" or scheme.startswith("postgres+"):
        scheme = "postgresql" + scheme.removeprefix("postgres")
    if "," in hosts and scheme.startswith("postgresql"):
        names, ports = [], []
        for entry in hosts.split(","):
            name, _, port = entry.rpartition(":") if not entry.endswith("]") and ":" in entry else (entry, "", "")
            if port and not port.isdigit():
                raise ConfigError(f"the database URL's host {entry!r} is not host:port")
            names.append(name.strip("[]"))
            ports.append(port)
        path, _, query = rest.partition("?")
        if re.search(r"(^|&)(host|port)=", query):
            raise ConfigError("the database URL gives its hosts twice: in the host part and in ?host= or ?port=")
        listed = f"host={','.join(names)}" + (f"&port={','.join(ports)}" if any(ports) else "")
        rest = f"{path or '/'}?{listed}" + (f"&{query}" if query else "")
        hosts = ""
    return f"{scheme}://{userinfo or ''}{hosts}{rest}"


def parse_url(url: str) -> URL:
    """`url` (`normal_url`) as SQLAlchemy's URL; one it cannot read is a `ConfigError`."""
    try:
        return make_url(normal_url(url))
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"{redacted(url)!r} is not a database URL; write e.g. {EXAMPLE_URLS}") from exc


def async_url(url: str) -> str:
    """The URL an operator writes (`sqlite:///roadie.db`) as the async driver's URL."""
    parsed = parse_url(url)
    if "+" not in parsed.drivername:
        driver = ASYNC_DRIVERS.get(parsed.get_backend_name())
        if driver:
            parsed = parsed.set(drivername=driver)
    if parsed.get_backend_name() in MYSQL_FAMILY and "charset" not in parsed.query:
        # Refs and messages are Unicode; the server's default may not be.
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed.render_as_string(hide_password=False)


def create_engine(url: str, *, blocking: bool = False, **kwargs: Any) -> AsyncEngine:
    """The engine for an operator's URL; a URL that names no database Roadie speaks is a
    `ConfigError` saying which it does. `blocking` asks, for a SQLite file, for an engine
    whose calls block (`roadie.store.blocking`), for a command that reads and exits; any
    other database gets the asyncio engine all the same."""
    url = normal_url(url)
    backend = parse_url(url).get_backend_name()
    if backend not in ASYNC_DRIVERS:
        raise ConfigError(f"{url.split('://')[0]!r} is no database Roadie can use; write e.g. {EXAMPLE_URLS}")
    if backend in MYSQL_FAMILY:
        # InnoDB's default, REPEATABLE READ, takes gap locks on the unique indexes that
        # insert-ignore relies on, and workers inserting side by side then wait on one
        # another for seconds. Every transaction here is guarded by its own WHERE
        # clauses, so read-committed is all it needs.
        kwargs.setdefault("isolation_level", "READ COMMITTED")
    if backend == "postgresql":
        url = _take_prepare_threshold(url, kwargs)
    url = _take_pool_size(url, kwargs)
    kwargs.setdefault("json_deserializer", json_loads)
    kwargs.setdefault("json_serializer", json_dumps)
    if blocking and backend == "sqlite" and (path := sqlite_file(make_url(url))) is not None:
        return _blocking_sqlite(url, path, kwargs)
    if backend == "sqlite":
        from roadie.store import sqlite_driver

        kwargs.setdefault("module", sqlite_driver.dbapi())
    # (Loaded here: SQLAlchemy's asyncio extension loads its ORM, and a command that reads
    # a SQLite file and exits has no use for either.)
    from sqlalchemy.ext.asyncio import create_async_engine

    try:
        engine = create_async_engine(async_url(url), **kwargs)
    except ImportError as exc:  # the driver is an extra: `postgresql` or `mariadb`
        extra = "mariadb" if backend in MYSQL_FAMILY else backend
        raise StoreError(
            f"{backend} needs its driver, {exc.name or exc}, which is not installed: pip install 'roadie[{extra}]'"
        ) from exc
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine.sync_engine)
    if engine.dialect.name == "postgresql":
        _configure_postgresql(engine)
    return engine


def _blocking_sqlite(url: str, path: Path, kwargs: dict[str, Any]) -> AsyncEngine:
    from sqlalchemy import create_engine as create_blocking_engine

    from roadie.store.blocking import BlockingEngine, open_sqlite_file

    engine = create_blocking_engine(url, creator=lambda: open_sqlite_file(path), **kwargs)
    configure_sqlite(engine)
    # What the store calls of an AsyncEngine, a BlockingEngine answers (see its module).
    return cast("AsyncEngine", BlockingEngine(engine))


POOL_SIZE = 15
"""Connections a process keeps to its database: as many as SQLAlchemy's default pool lets
it hold at once (5, and 10 more in a burst), but kept. The default closes each of the ten as
it is given back, so under steady concurrency (the web server's clients, a worker's drain
beside its heartbeats) connections were opened and closed all the time: 2,050 run pages
from 50 clients opened 97 SQLite connections (a thread, the file and its PRAGMAs each),
against 15 kept, and each would be a server process on PostgreSQL. A task that finds all
of them busy waits for one, up to `pool_timeout` (30 s). For a database server; a SQLite
file keeps SQLAlchemy's default unless its URL says `?pool_size=N` (see `_take_pool_size`)."""


def _take_pool_size(url: str, kwargs: dict[str, Any]) -> str:
    """The pool's size: `POOL_SIZE`, or the URL's `?pool_size=N` (more for a web server with
    many clients, fewer under a small `max_connections`), taken out of the URL as
    `prepare_threshold` is. An in-memory SQLite database has one connection, and no pool
    to size. A SQLite file keeps SQLAlchemy's default (5, and 10 opened for a burst) unless
    the URL sizes it: with 15 kept on SQLite, full runs of the suite have found an aiosqlite
    connection left unclosed (a ResourceWarning, once in one run, twice in another, each
    raised while a later test of another database ran, when the connection was collected),
    not yet traced to its store; the suite on SQLite alone did not show it."""
    value, url = _take_url_option(url, "pool_size")
    if value is not None and (not value.isdigit() or int(value) < 1):
        raise ConfigError(f"pool_size={value!r} in the database URL: write a number of connections, 1 or more")
    parsed = make_url(url)
    if "poolclass" in kwargs:
        return url
    if parsed.get_backend_name() == "sqlite" and (value is None or sqlite_file(parsed) is None):
        return url
    kwargs.setdefault("pool_size", int(value) if value is not None else POOL_SIZE)
    kwargs.setdefault("max_overflow", 0)
    return url


def _take_url_option(url: str, name: str) -> tuple[str | None, str]:
    """The value of Roadie's own option `name` in a database URL's query (the last, if it
    is given twice), and the URL without it, since the driver would be handed it as text."""
    parsed = make_url(url)
    value = parsed.query.get(name)
    if value is None:
        return None, url
    if isinstance(value, tuple):
        value = value[-1]
    return value, parsed.difference_update_query([name]).render_as_string(hide_password=False)


def _take_prepare_threshold(url: str, kwargs: dict[str, Any]) -> str:
    """psycopg prepares a statement on the server once a connection has run it
    `prepare_threshold` times (5): Roadie's drain on PostgreSQL runs 15 % more steps a
    second with it (2030 against 1762, 1 run of 1000 steps, medians of an interleaved A/B
    of 9 trials each). Behind a pooler in transaction mode (PgBouncer
    before 1.21, or after it without `max_prepared_statements`) the next transaction may
    run on another server connection, where the statement does not exist: the URL's
    `?prepare_threshold=none` turns preparing off, as psycopg's own parameter of that name
    does. Taken out of the URL here, since the driver would be handed it as text."""
    value, url = _take_url_option(url, "prepare_threshold")
    if value is None:
        return url
    connect_args = dict(kwargs.get("connect_args", {}))
    if value.lower() in ("none", "off", "false"):
        connect_args["prepare_threshold"] = None
    elif value.isdigit():
        connect_args["prepare_threshold"] = int(value)
    else:
        raise ConfigError(f"prepare_threshold={value!r} in the database URL: write none, or a number of runs")
    kwargs["connect_args"] = connect_args
    return url


READ_ONLY = "roadie_read_only"
ONE_STATEMENT = "roadie_one_statement"  # a read that runs one statement: no transaction of its own is needed
"""The execution option a connection that only reads is given."""


def _configure_postgresql(engine: AsyncEngine) -> None:
    # A list is an array parameter (`unnested`, `one_of`): sent in binary, where each
    # element goes as it is, length first. psycopg's text form quotes and escapes every
    # element in Python, which costs ten times the plain parameter for a JSON value of a
    # megabyte (a module's answer may be 8 MiB).
    from psycopg.types.array import ListBinaryDumper  # (the driver is an extra)

    @event.listens_for(engine.sync_engine, "connect")
    def _connect(_dbapi_connection: Any, record: Any) -> None:
        record.driver_connection.adapters.register_dumper(list, ListBinaryDumper)


def configure_sqlite(engine: Engine) -> None:
    # pysqlite's own transaction handling begins lazily and as DEFERRED, so two writers
    # can both read and then deadlock on the upgrade to a write lock. Take the write
    # lock at BEGIN instead. A read says so (`READ_ONLY`) and begins DEFERRED: with WAL
    # it reads a snapshot and neither waits for a writer nor holds one up.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_WAIT_MS}")
        _journal_to_wal(cursor)
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    # A read of one statement needs no BEGIN at all (`ONE_STATEMENT`): SQLite reads each
    # statement from one snapshot by itself, and the BEGIN would cost a round trip to
    # aiosqlite's thread, as much as the read.
    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        options = conn.get_execution_options()
        if options.get(ONE_STATEMENT):
            return
        conn.exec_driver_sql("BEGIN" if options.get(READ_ONLY) else "BEGIN IMMEDIATE")

    # Nor does a read that began none need a ROLLBACK when it ends (nor the pool one when
    # the connection goes back): each is a round trip to aiosqlite's thread, and the
    # connection knows without one whether a transaction is open.
    dialect = engine.dialect
    rollback = dialect.do_rollback

    def _rollback(dbapi_connection: Any) -> None:
        try:
            # (aiosqlite's adapter holds the sqlite3 connection; the blocking engine's is one)
            open_ = getattr(dbapi_connection, "driver_connection", dbapi_connection).in_transaction
        except Exception:  # a closed connection: the driver's own rollback says how
            open_ = True
        if open_:
            rollback(dbapi_connection)

    dialect.do_rollback = _rollback  # type: ignore[method-assign]


SQLITE_BUSY_WAIT_MS = 30_000


def _journal_to_wal(cursor: Any) -> None:
    """Put the file in WAL mode (which it keeps). A new file turned to WAL by two
    connections at once can answer "database is locked" at once, without waiting out the
    busy timeout: that is tried again, briefly, for as long as the busy timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_WAIT_MS / 1000
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "database is locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)  # only ever while a new file is first opened
        pause = min(pause * 2, 0.1)


def is_transient(dialect_name: str, error: BaseException) -> bool:
    """A deadlock or serialisation failure: the transaction can simply be run again."""
    orig = getattr(error, "orig", error)
    if dialect_name == "postgresql":
        return getattr(orig, "sqlstate", None) in ("40001", "40P01")
    if dialect_name in MYSQL_FAMILY:
        # The driver's error carries MariaDB's code first: (1213, 'Deadlock found...').
        code: Any = orig.args[0] if getattr(orig, "args", None) else None
        while isinstance(code, tuple) and code:
            code = code[0]
        return code in (1213, 1205)
    return False


# PostgreSQL: class 08 (connection exception) and 57P01-57P03 (the server is shutting
# down, crashed, or not yet accepting connections after a restart).
_PG_CONNECTION_STATES = ("57P01", "57P02", "57P03")
# MariaDB client and server codes: can't connect (2002, 2003), server gone away (2006),
# lost connection (2013), connection killed (1927), disconnected by the server (4031).
_MYSQL_CONNECTION_CODES = (2002, 2003, 2006, 2013, 1927, 4031)


def is_connection_lost(dialect_name: str, error: BaseException) -> bool:
    """The connection to the server broke or could not be made (a server restart, a
    killed backend, a network cut): a transaction that never reached its commit can be
    run again on a new connection."""
    if getattr(error, "connection_invalidated", False):
        return True  # SQLAlchemy saw a disconnect, and has already dropped the pool's stale connections
    orig = getattr(error, "orig", error)
    if dialect_name == "postgresql":
        state = getattr(orig, "sqlstate", None)
        if state is None:
            # psycopg says "connection failed" (refused, reset) without a SQLSTATE.
            return type(orig).__name__ == "OperationalError"
        return str(state).startswith("08") or state in _PG_CONNECTION_STATES
    if dialect_name in MYSQL_FAMILY:
        code: Any = orig.args[0] if getattr(orig, "args", None) else None
        while isinstance(code, tuple) and code:
            code = code[0]
        return code in _MYSQL_CONNECTION_CODES
    return False


IN_MEMORY = "sqlite:///:memory:"


def exists(url: str) -> bool:
    """Whether the database at `url` may already exist: false only for a SQLite file that
    is not there (a server's database is never made by opening it)."""
    try:
        parsed = parse_url(url)
    except ConfigError:
        return True  # let opening it say what is wrong with it
    path = sqlite_file(parsed)
    return path is None or path.exists()


def sqlite_file(url: URL) -> Path | None:
    """The absolute path of a SQLite database's file; None for an in-memory one or a server's."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if url.query.get("mode") == "memory":  # file:NAME?mode=memory&uri=true
        return None
    return Path(url.database).expanduser().absolute()


def journal_file_to_wal(url: URL) -> None:
    """Turn a SQLite file to WAL (creating it if need be) before the engine opens it.

    The switch writes the file's first page, in the rollback journal's locking. Made by
    each connection as it connects, it raced with the transactions of connections that
    had already switched: on a new file opened by several stores at once (workers
    starting together), one connection could wait out the whole busy timeout on another
    and fail with "database is locked" (1 to 8 times in 40 tries, four stores at once).
    Made here first, on a connection that holds nothing else, every connection of the
    engine then finds the file in WAL already."""
    path = sqlite_file(url)
    if path is None:
        return
    connection = sqlite3.connect(path, timeout=SQLITE_BUSY_WAIT_MS / 1000, isolation_level=None)
    try:
        _journal_to_wal(connection.cursor())
    finally:
        connection.close()


def file_identity(url: URL) -> tuple[str, int, int] | None:
    """A SQLite file's absolute path, device and inode; None for anything else."""
    path = sqlite_file(url)
    if path is None:
        return None
    try:
        found = path.stat()
    except OSError:
        return None
    return str(path), found.st_dev, found.st_ino


# Query parameters the drivers take a password from (libpq's, and MySQL's); a URL may
# carry its password there instead of before the `@`.
SECRET_QUERY_KEYS = frozenset({"password", "passwd", "sslpassword"})


def redacted(url: str | URL) -> str:
    """`url` as it may be shown or logged: its password, if it has one, as `***`, whether
    it is given before the `@` or in the query (`?password=...`). A list in the query
    (`?host=h1,h2`) is shown with its commas."""
    try:
        parsed = url if isinstance(url, URL) else make_url(normal_url(url))
    except (ArgumentError, ValueError, ConfigError):
        text = str(url)
        hidden = "@" in text or any(key in text.lower() for key in ("pass", "secret"))
        return text.split("://")[0] + "://…" if hidden else text
    secret = [key for key in parsed.query if key.lower() in SECRET_QUERY_KEYS]
    if secret:
        parsed = parsed.update_query_dict(dict.fromkeys(secret, "***"))
    shown = parsed.render_as_string(hide_password=True)
    return shown.replace("%2C", ",").replace("%3A", ":").replace("%2A%2A%2A", "***")


def missing_folder(url: URL) -> Path | None:
    """For a SQLite file whose folder does not exist, that folder (SQLite would only say
    "unable to open database file")."""
    path = sqlite_file(url)
    if path is None:
        return None
    return None if path.parent.is_dir() else path.parent


def describe_failure(error: BaseException) -> str:
    """The driver's own reason for a failure, on one line, without SQLAlchemy's wrapping."""
    orig = getattr(error, "orig", None) or error
    text = " ".join(str(orig).split())
    return text[:300] or type(orig).__name__


def is_unreachable(dialect_name: str, error: BaseException) -> bool:
    """No connection could be made at all (refused, no such host), as opposed to one the
    server dropped: at startup there is then nothing to wait for."""
    orig = getattr(error, "orig", error)
    if dialect_name == "postgresql":
        return getattr(orig, "sqlstate", None) is None and str(orig).startswith("connection failed")
    if dialect_name in MYSQL_FAMILY:
        code: Any = orig.args[0] if getattr(orig, "args", None) else None
        while isinstance(code, tuple) and code:
            code = code[0]
        return code in (2002, 2003, 2005)
    return False


def refuses_data(error: BaseException) -> bool:
    """Whether the database refused what a statement carried (a value it cannot keep, a
    constraint), rather than failing to run it (a lost connection, a full disk): the
    same statement will be refused again, while the next one may well go in."""
    cause = error.__cause__ if isinstance(error, StoreError) else error
    return isinstance(cause, DataError | IntegrityError)


def returning_update(dialect_name: str) -> bool:
    """Whether UPDATE ... RETURNING exists (SQLite, PostgreSQL; not MariaDB)."""
    return dialect_name not in MYSQL_FAMILY


def skip_locked(dialect_name: str, query: Select[Any], *, of: Table | None = None) -> Select[Any]:
    """Lock the rows `query` reads, skipping rows another transaction holds, so that two
    workers claiming at once take different rows instead of waiting for each other.
    SQLite has no row locks: its one writer at a time does the same job."""
    if dialect_name == "sqlite":
        return query
    return query.with_for_update(skip_locked=True, of=of)

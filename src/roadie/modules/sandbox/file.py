"""The sandbox world's file: its schema, its seed, and one transaction per operation.

WAL mode, one transaction per operation, nothing cached in memory: a fresh object on the
same file, after the previous one was abandoned, sees exactly what was committed.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from roadie.clock import Clock

SEED_REGIONS = ("britain", "moonglow", "trinsic", "yew", "minoc")
SEED_SETTINGS: dict[str, Any] = {"xp_rate": 1.0, "motd": ""}
FIRST_SERIAL = 0x40000001
# 2: fence marks (docs/protocol.md §4, rule 7). A file of version 1 gets the table, empty:
# no fence was ever accepted there, so none is refused.
SCHEMA_VERSION = 2

# Object kinds as the ledger names them -> the table that holds them. Table names are
# only ever taken from this mapping, never from a caller, so formatting them into SQL
# is safe.
TABLES = {"creature": "creatures", "item": "items"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS regions (
    name TEXT PRIMARY KEY,
    weather TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS creatures (
    serial TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    region TEXT NOT NULL,
    tag TEXT,
    idx INTEGER,
    UNIQUE (tag, idx)
);
CREATE TABLE IF NOT EXISTS items (
    serial TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    region TEXT NOT NULL,
    tag TEXT,
    idx INTEGER,
    UNIQUE (tag, idx)
);
CREATE TABLE IF NOT EXISTS buffs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    region TEXT NOT NULL,
    expires_at REAL NOT NULL,
    tag TEXT
);
CREATE TABLE IF NOT EXISTS broadcasts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message TEXT NOT NULL,
    region TEXT,
    at TEXT NOT NULL,
    tag TEXT
);
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    answer TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT,
    op TEXT NOT NULL CHECK (op IN ('create', 'remove', 'set')),
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    idx INTEGER,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_by_key ON effects (key, op, kind, idx);
CREATE TABLE IF NOT EXISTS dispatches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    op TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started REAL NOT NULL,
    ended REAL
);
CREATE TABLE IF NOT EXISTS respawn_rules (
    kind TEXT PRIMARY KEY,
    seconds REAL NOT NULL CHECK (seconds >= 0)
);
CREATE TABLE IF NOT EXISTS respawns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    region TEXT NOT NULL,
    tag TEXT NOT NULL,
    due REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (
    kind TEXT NOT NULL CHECK (kind IN ('key', 'lease')),
    target TEXT NOT NULL,
    mark INTEGER NOT NULL CHECK (mark >= 1),
    PRIMARY KEY (kind, target)
);
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('fail', 'lose', 'crash', 'fail_revert', 'lose_revert')),
    action TEXT,
    remaining INTEGER NOT NULL CHECK (remaining > 0),
    message TEXT
);
"""
# The knobs a file made before `lose_revert` existed can hold: its faults table is made
# again (knobs are armed for one test, so none is worth carrying over).
_OLD_FAULTS = "'fail_revert'))"


class WorldFile:
    """The world's SQLite file at `path`, and the `clock` it reads time from.

    The file is created and seeded (regions with clear weather, `xp_rate = 1.0`, an empty `motd`) only
    when it is new; opening an existing file never re-seeds it.
    """

    def __init__(self, path: str, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        # Calls may come from the event loop and from worker threads; sqlite3 objects are
        # not safe to share between threads without a lock, so every use takes it.
        self._lock = threading.RLock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is
        # exactly one method call and never spans two.
        self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._create()

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the file. Everything was committed already; closing is only tidiness."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r}>"

    def _create(self) -> None:
        with self._transaction() as db:
            # Statement by statement: executescript() would COMMIT our transaction first.
            old = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'faults'").fetchone()
            if old is not None and _OLD_FAULTS in old[0]:
                db.execute("DROP TABLE faults")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            seeded = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if seeded is not None:
                # An older file has had its new tables made above; it is now this version.
                if int(seeded[0]) < SCHEMA_VERSION:
                    db.execute("UPDATE meta SET value = ? WHERE name = 'schema'", (str(SCHEMA_VERSION),))
                return
            # Seed inside the same transaction that records the schema version, so two
            # processes opening a new file at once cannot both seed it.
            db.executemany(
                "INSERT INTO regions (name, weather) VALUES (?, 'clear')",
                [(name,) for name in SEED_REGIONS],
            )
            db.executemany(
                "INSERT INTO settings (name, value) VALUES (?, ?)",
                [(name, json.dumps(value)) for name, value in SEED_SETTINGS.items()],
            )
            db.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?)",
                [("schema", str(SCHEMA_VERSION)), ("next_serial", str(FIRST_SERIAL)), ("delay", "0")],
            )

    def _wake(self, db: sqlite3.Connection) -> None:
        """What the world does by itself as its clock moves, done by whoever looks next
        (the sandbox world's respawns); nothing here."""

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front: two processes on one file then queue
        # instead of failing halfway with "database is locked" on their first write.
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

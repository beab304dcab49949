"""The plugin-side key ledger: `idempotency key -> (action, status, answer)` in its own
SQLite file (DESIGN §6).

Delivery is at-least-once: the engine retries a step whose answer it never saw, and a
pulled call is handed out again after its visibility timeout. The key ledger is what
makes every effect exactly-once anyway. A key whose answer is stored gets that answer
back and the world is not touched again; a key that failed may run again; a key being
run by another live process is refused (409, retryable) rather than run twice.

A key that has been reverted keeps a tombstone, and is never dispatched again: a late
duplicate of the dispatch, arriving after cleanup reverted the step, would otherwise
make something no cleanup will ever look for.

Every call that changes the world carries a fence (docs/protocol.md §4, rule 7), and the
ledger keeps, per fence target (a step's key, or `lease#target`), the highest fence it has
accepted: its mark. A call under a lower fence is refused before any other rule (a stored
answer is not replayed to it): it comes from an owner whose claim has lapsed. The mark is
checked and raised in the same transaction as the key ledger's verdict, so no call slips
between the two.

One transaction per method (`BEGIN IMMEDIATE`, WAL), nothing cached in memory: two
processes serving one ledger file queue on its write lock, and a process killed at any
point leaves only committed rows behind.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from roadie.clock import Clock, SystemClock
from roadie.protocol import lease_fence_target

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed', 'never')),
    answer TEXT,
    owner TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    reverts INTEGER NOT NULL DEFAULT 0,
    reverted_at REAL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS late_resources (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    resource TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS late_resources_by_key ON late_resources (key, id);
CREATE TABLE IF NOT EXISTS lease_keys (
    key TEXT PRIMARY KEY,
    lease TEXT NOT NULL,
    target TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    applied_at REAL,
    answer TEXT,
    restored_at REAL,
    restored_by TEXT,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS lease_keys_by_target ON lease_keys (lease, target, run_id);
CREATE TABLE IF NOT EXISTS lease_restores (
    key TEXT PRIMARY KEY,
    lease TEXT NOT NULL,
    target TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    done_at REAL,
    answer TEXT,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS lease_restores_by_target ON lease_restores (lease, target, run_id);
CREATE TABLE IF NOT EXISTS seen_requests (
    id TEXT PRIMARY KEY,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS seen_requests_by_expiry ON seen_requests (expires);
CREATE TABLE IF NOT EXISTS fences (
    kind TEXT NOT NULL CHECK (kind IN ('key', 'lease')),
    target TEXT NOT NULL,
    mark INTEGER NOT NULL CHECK (mark >= 1),
    updated_at REAL NOT NULL,
    PRIMARY KEY (kind, target)
);
"""


FenceKind = Literal["key", "lease"]  # what a fence is counted for: a step's key, a lease target


class KeyStatus(StrEnum):
    RUNNING = "running"  # an action call holds the key (its owner names the process)
    DONE = "done"  # the answer is stored
    FAILED = "failed"  # the last call raised; the key may run again
    NEVER = "never"  # known only from a revert: never dispatched here


@dataclass(frozen=True)
class KeyEntry:
    key: str
    action: str
    status: KeyStatus
    answer: Any
    owner: str | None
    attempts: int
    error: str | None
    reverts: int
    reverted_at: float | None

    @property
    def reverted(self) -> bool:
        return self.reverted_at is not None


@dataclass(frozen=True)
class Begun:
    """What `begin` found. Exactly one of: `run` (call the action), `answer` (stored, do
    not call), `busy` (another live process is calling it), `refused` (a message),
    `superseded` (the mark of the call's fence target, higher than its fence: nothing
    was looked at or changed)."""

    run: bool = False
    answer: Any = None
    stored: bool = False
    busy: str | None = None
    refused: str | None = None
    superseded: int | None = None


# Ledger owners alive in this process: a `running` row whose owner is this process but
# not one of these was left by an earlier, closed ledger object (a crash simulated in
# one process), and is stale.
_LIVE_OWNERS: set[str] = set()


def _start_time(pid: int) -> str:
    """The kernel's start time of `pid` (Linux), so a recycled pid is not taken for the
    process that died; empty where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name (field 2) may hold spaces; fields after its ')' are fixed.
            fields = stat.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return ""


_HOST = socket.gethostname()


def _owner_alive(owner: str) -> bool:
    host, _, rest = owner.partition("|")
    if host != _HOST:
        return True  # another machine's process: we cannot tell, so it is not ours to take
    pid_text, _, rest = rest.partition("|")
    started, _, _token = rest.partition("|")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return owner in _LIVE_OWNERS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return not started or _start_time(pid) == started


class KeyLedger:
    """The key ledger in the SQLite file at `path`."""

    def __init__(self, path: str, clock: Clock | None = None) -> None:
        self.path = path
        self.clock: Clock = clock or SystemClock()
        self.owner = f"{_HOST}|{os.getpid()}|{_start_time(os.getpid())}|{uuid.uuid4().hex[:12]}"
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        with self._transaction() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
        _LIVE_OWNERS.add(self.owner)

    def close(self) -> None:
        _LIVE_OWNERS.discard(self.owner)
        with self._lock:
            self._db.close()

    def __enter__(self) -> KeyLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<KeyLedger {self.path!r}>"

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _now(self) -> float:
        return self.clock.now().timestamp()

    # -- requests ----------------------------------------------------------------------

    def first_sight(self, request_id: str, expires: float) -> bool:
        """Keep a signed request's id until `expires` (Unix seconds); whether this is the
        first time it came. Kept here, not in memory, so a restart or a second process
        on this ledger takes no replay of a request the first one took."""
        with self._transaction() as db:
            db.execute("DELETE FROM seen_requests WHERE expires < ?", (self._now(),))
            kept = db.execute("INSERT OR IGNORE INTO seen_requests (id, expires) VALUES (?, ?)", (request_id, expires))
            return kept.rowcount == 1

    # -- fences ------------------------------------------------------------------------

    @staticmethod
    def _fence(db: sqlite3.Connection, kind: FenceKind, target: str, fence: int, now: float) -> int | None:
        """Check `fence` against the mark of `target` inside the caller's transaction: the
        mark when the fence is lower (refuse the call), else None, the mark now `fence`.
        Fence 0 is a call no claim stands behind (an in-process test): never refused, and
        it raises no mark. Keys and lease targets are counted apart (a key may be spelt
        like an untargeted lease)."""
        if fence <= 0:
            return None
        row = db.execute("SELECT mark FROM fences WHERE kind = ? AND target = ?", (kind, target)).fetchone()
        if row is not None and fence < row[0]:
            return int(row[0])
        db.execute(
            "INSERT INTO fences (kind, target, mark, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (kind, target) DO UPDATE SET mark = excluded.mark, updated_at = excluded.updated_at"
            " WHERE excluded.mark > fences.mark",
            (kind, target, fence, now),
        )
        return None

    def mark(self, kind: FenceKind, target: str) -> int | None:
        """The highest fence accepted for a step's key (`"key"`) or a lease target
        (`"lease"`, `lease#target`), or None when none was."""
        with self._transaction() as db:
            row = db.execute("SELECT mark FROM fences WHERE kind = ? AND target = ?", (kind, target)).fetchone()
        return None if row is None else int(row[0])

    # -- dispatch ----------------------------------------------------------------------

    def begin(self, key: str, action: str, fence: int = 0) -> Begun:
        """Claim `key` for a call of `action` under `fence`, unless the key's mark is higher
        (superseded), its answer is stored (then that), it belongs to another action or
        was reverted (refused), or another live process is calling it (busy). A `running`
        row of a dead process is taken over."""
        with self._transaction() as db:
            mark = self._fence(db, "key", key, fence, self._now())
            if mark is not None:
                return Begun(superseded=mark)
            row = db.execute(
                "SELECT action, status, answer, owner, reverted_at FROM keys WHERE key = ?", (key,)
            ).fetchone()
            if row is not None:
                stored_action, status, answer, owner, reverted_at = row
                if stored_action != action:
                    return Begun(refused=f"key {key!r} was used for {stored_action!r}, not {action!r}")
                if reverted_at is not None:
                    return Begun(refused=f"key {key!r} was reverted; a reverted step is not dispatched again")
                if status == KeyStatus.DONE:
                    return Begun(answer=json.loads(answer), stored=True)
                if status == KeyStatus.RUNNING and owner != self.owner and _owner_alive(owner):
                    return Begun(busy=owner)
            db.execute(
                "INSERT INTO keys (key, action, status, owner, attempts, updated_at) VALUES (?, ?, 'running', ?, 1, ?)"
                " ON CONFLICT (key) DO UPDATE SET status = 'running', owner = excluded.owner,"
                " attempts = keys.attempts + 1, error = NULL, updated_at = excluded.updated_at",
                (key, action, self.owner, self._now()),
            )
        return Begun(run=True)

    def finish(self, key: str, answer: Any) -> None:
        """Store `key`'s answer: from now on it is what every dispatch of the key gets."""
        with self._transaction() as db:
            db.execute(
                "UPDATE keys SET status = 'done', answer = ?, owner = NULL, updated_at = ? WHERE key = ?",
                (json.dumps(answer), self._now(), key),
            )

    def fail(self, key: str, error: str) -> None:
        """The call raised: the key may run again."""
        with self._transaction() as db:
            db.execute(
                "UPDATE keys SET status = 'failed', owner = NULL, error = ?, updated_at = ?"
                " WHERE key = ? AND status = 'running'",
                (error[:2000], self._now(), key),
            )

    # -- revert ------------------------------------------------------------------------

    def begin_revert(self, key: str, action: str, fence: int = 0) -> Begun:
        """Tombstone `key` (no dispatch of it runs again) and answer what it produced: its
        stored answer's resources and its late ones, `[]` when no answer is stored. Busy
        while another live process is calling the key; superseded (nothing tombstoned)
        when the key's mark is higher than `fence`."""
        with self._transaction() as db:
            mark = self._fence(db, "key", key, fence, self._now())
            if mark is not None:
                return Begun(superseded=mark)
            row = db.execute("SELECT status, answer, owner FROM keys WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] == KeyStatus.RUNNING and row[2] != self.owner and _owner_alive(row[2]):
                return Begun(busy=row[2])
            now = self._now()
            db.execute(
                "INSERT INTO keys (key, action, status, updated_at, reverted_at) VALUES (?, ?, 'never', ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET reverted_at = COALESCE(keys.reverted_at, excluded.reverted_at),"
                " status = CASE keys.status WHEN 'running' THEN 'failed' ELSE keys.status END,"
                " owner = NULL, updated_at = excluded.updated_at",
                (key, action, now, now),
            )
            resources: list[Any] = []
            if row is not None and row[0] == KeyStatus.DONE and row[1] is not None:
                answer = json.loads(row[1])
                if isinstance(answer, dict) and isinstance(answer.get("resources"), list):
                    resources = list(answer["resources"])
                resources += [json.loads(r) for (r,) in db.execute(_LATE, (key,))]
        return Begun(run=True, answer=resources)

    def finish_revert(self, key: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE keys SET reverts = reverts + 1, updated_at = ? WHERE key = ?", (self._now(), key))

    # -- leases ------------------------------------------------------------------------
    #
    # A borrow is a read and an apply under the borrowing step's key; giving it back is a
    # restore under a key of its own (one per engine ledger row), naming the same run,
    # lease and target. A restore marks every borrow of that run and target seen so far as
    # given back, so an apply delivered late (a queued call redelivered, a slow request)
    # cannot write the borrowed value again over the restored one.

    def seen_lease(self, key: str, lease: str, target: str | None, run_id: int) -> None:
        """A read under `key`: the engine reads before it borrows, so every borrow's key is
        known here before its apply, and an apply of a key never seen is a late one."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO lease_keys (key, lease, target, run_id, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (key) DO NOTHING",
                (key, lease, target or "", run_id, self._now()),
            )

    def begin_apply(self, key: str, lease: str, target: str | None, run_id: int, fence: int = 0) -> Begun:
        """May `key` write its borrowed value under `fence`? Superseded when the lease
        target's mark is higher; refused once its borrow was given back (or, for a key
        never seen, once every borrow of the run on the target was); its stored answer
        when it was applied already; else run."""
        where = (lease, target or "", run_id)
        with self._transaction() as db:
            mark = self._fence(db, "lease", lease_fence_target(lease, target), fence, self._now())
            if mark is not None:
                return Begun(superseded=mark)
            row = db.execute("SELECT applied_at, answer, restored_by FROM lease_keys WHERE key = ?", (key,)).fetchone()
            if row is not None and row[2] is not None:
                given_back = f"key {key!r}: its borrow was given back ({row[2]})"
                return Begun(refused=f"{given_back}; a late apply is not carried out")
            if row is not None and row[0] is not None:
                return Begun(answer=json.loads(row[1]), stored=True)
            if row is None:
                live = db.execute(
                    "SELECT 1 FROM lease_keys WHERE lease = ? AND target = ? AND run_id = ? AND restored_by IS NULL",
                    where,
                ).fetchone()
                given_back = db.execute(
                    "SELECT key FROM lease_restores WHERE lease = ? AND target = ? AND run_id = ?"
                    " ORDER BY at DESC LIMIT 1",
                    where,
                ).fetchone()
                if live is None and given_back is not None:
                    # Never read under this key (a second borrow of a target the run holds
                    # skips the read), and nothing of the run on this target is still
                    # borrowed: it shared a borrow that was given back, and lost the race
                    # to its restore. Tombstoned, so its duplicates are refused the same way.
                    db.execute(
                        "INSERT INTO lease_keys (key, lease, target, run_id, restored_at, restored_by, updated_at)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (key, *where, self._now(), given_back[0], self._now()),
                    )
                    return Begun(
                        refused=f"key {key!r}: the run's borrow of this target was given back ({given_back[0]});"
                        " a late apply is not carried out"
                    )
                db.execute(
                    "INSERT INTO lease_keys (key, lease, target, run_id, updated_at) VALUES (?, ?, ?, ?, ?)",
                    (key, *where, self._now()),
                )
        return Begun(run=True)

    def finish_apply(self, key: str, answer: Any) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE lease_keys SET applied_at = ?, answer = ?, updated_at = ?"
                " WHERE key = ? AND restored_by IS NULL",
                (self._now(), json.dumps(answer), self._now(), key),
            )

    def begin_restore(self, key: str, lease: str, target: str | None, run_id: int, fence: int = 0) -> Begun:
        """Mark the run's borrows of the target given back (before the world is written,
        so no apply slips in after it), and say whether to write: a restore already
        carried out answers its stored answer, without writing, once a borrow of the
        target (by any run) was applied after it — writing it again would give back a
        value over a value someone borrowed since. Superseded, marking nothing, when the
        lease target's mark is higher than `fence`."""
        where = (lease, target or "", run_id)
        now = self._now()
        with self._transaction() as db:
            mark = self._fence(db, "lease", lease_fence_target(lease, target), fence, now)
            if mark is not None:
                return Begun(superseded=mark)
            db.execute(
                "UPDATE lease_keys SET restored_at = ?, restored_by = ?, updated_at = ?"
                " WHERE lease = ? AND target = ? AND run_id = ? AND restored_by IS NULL",
                (now, key, now, *where),
            )
            row = db.execute("SELECT done_at, answer FROM lease_restores WHERE key = ?", (key,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO lease_restores (key, lease, target, run_id, at) VALUES (?, ?, ?, ?, ?)",
                    (key, *where, now),
                )
            elif row[0] is not None:
                since = db.execute(
                    "SELECT key FROM lease_keys WHERE lease = ? AND target = ? AND applied_at > ? LIMIT 1",
                    (lease, target or "", row[0]),
                ).fetchone()
                if since is not None:
                    return Begun(answer=json.loads(row[1]), stored=True)
        return Begun(run=True)

    def finish_restore(self, key: str, answer: Any) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE lease_restores SET done_at = ?, answer = ? WHERE key = ?",
                (self._now(), json.dumps(answer), key),
            )

    # -- late resources ----------------------------------------------------------------

    def add_late(self, key: str, resources: list[dict[str, Any]]) -> None:
        """Remember resources reported late against `key`, so a revert by key alone takes
        them back down too."""
        now = self._now()
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO late_resources (key, resource, at) VALUES (?, ?, ?)",
                [(key, json.dumps(r), now) for r in resources],
            )

    def late(self, key: str) -> list[dict[str, Any]]:
        with self._transaction() as db:
            return [json.loads(r) for (r,) in db.execute(_LATE, (key,))]

    # -- readers -----------------------------------------------------------------------

    def entry(self, key: str) -> KeyEntry | None:
        with self._transaction() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else _entry(row)

    def entries(self) -> list[KeyEntry]:
        """Every key, oldest first."""
        with self._transaction() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM keys ORDER BY rowid").fetchall()
        return [_entry(row) for row in rows]


_LATE = "SELECT resource FROM late_resources WHERE key = ? ORDER BY id"
_COLUMNS = "key, action, status, answer, owner, attempts, error, reverts, reverted_at"


def _entry(row: tuple[Any, ...]) -> KeyEntry:
    key, action, status, answer, owner, attempts, error, reverts, reverted_at = row
    return KeyEntry(
        key=key,
        action=action,
        status=KeyStatus(status),
        answer=None if answer is None else json.loads(answer),
        owner=owner,
        attempts=attempts,
        error=error,
        reverts=reverts,
        reverted_at=reverted_at,
    )

"""The sandbox world: creatures, items, regions, settings and buffs in one SQLite file.

It stands in for the world other software owns (DESIGN §7): the demo runs against it and
the reliability tests use it to prove that after cleanup the world equals the world
before the run. It behaves like a well-made game-server plugin:

- **Exactly once per key.** Every call that changes the world carries the step's
  idempotency key. A key whose answer is stored in the key ledger gets that answer back
  and the world is not touched again; a key that half-ran (the world crashed mid-call)
  makes only the objects it has not made yet. Each object remembers the key that made
  it (`tag`) and its index within that key's call (`idx`), unique together.
- **Tag what you make.** A removal names the key, and only an object carrying that tag
  is removed: a serial reused by the world for someone else's object is left alone.
  Removing something that is already gone is a success.
- **Crash-safe.** WAL mode, one transaction per operation, nothing cached in memory: a
  fresh object on the same file, after the previous one was abandoned, sees exactly
  what was committed.

Fault knobs make it misbehave on purpose. The counted knobs (`fail_next`, `lose_next`,
`crash_next`, `fail_reverts_next`) and `delay` are rows in the world file, so a fresh
object or another process serving the same file sees them; `set_random_faults` lives in
the object's memory, because a seeded random stream cannot be shared between processes
and stay reproducible.

For the reliability tests, `faults_met` counts the faults this object's calls met by
kind, and `hook`, when set, is called on either side of every operation's transaction
(the crash tests kill the process there).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar, cast

from roadie.clock import Clock
from roadie.errors import AnswerLost, PermanentError, RetryableError

T = TypeVar("T")

SEED_REGIONS = ("britain", "moonglow", "trinsic", "yew", "minoc")
SEED_SETTINGS: dict[str, Any] = {"xp_rate": 1.0}
FIRST_SERIAL = 0x40000001
SCHEMA_VERSION = 1

# The world's own operations, by the names the fault knobs match on. A knob armed with
# `action=None` matches any of ACTION_OPS; lease reads and writes are only hit by a knob
# that names them (`weather`, `weather.write`, `xp_rate.read`...), so arming "fail the
# next spawn" never breaks the engine's lease bookkeeping by accident.
ACTION_OPS = frozenset({"spawn", "place_item", "broadcast", "buff"})

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
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('fail', 'lose', 'crash', 'fail_revert')),
    action TEXT,
    remaining INTEGER NOT NULL CHECK (remaining > 0),
    message TEXT
);
"""


class FaultKind(StrEnum):
    """What an armed knob does to the call that meets it."""

    FAIL = "fail"  # raise RetryableError before touching the world
    LOSE = "lose"  # apply, store the answer, then raise AnswerLost
    CRASH = "crash"  # apply half, store no answer, raise WorldCrashed
    FAIL_REVERT = "fail_revert"  # a revert raises RetryableError before touching the world
    DUPLICATE = "duplicate"  # random only: the call is delivered a second time after it answered


class WorldCrashed(RuntimeError):
    """The sandbox world crashed mid-call (an injected fault): part of the effect is applied,
    no answer was stored."""


@dataclass(frozen=True)
class _Fault:
    kind: FaultKind
    message: str


def _op_name(action: str | None) -> str | None:
    """Knobs accept `spawn` or the action id `sandbox.spawn`."""
    if action is None:
        return None
    return action.removeprefix("sandbox.")


def _matches(pattern: str | None, op: str) -> bool:
    # "weather" matches both "weather.read" and "weather.write".
    if pattern is None:
        return op in ACTION_OPS
    return op == pattern or op.startswith(pattern + ".")


class SandboxWorld:
    """A small world in its own SQLite file at `path`, reading time from `clock`.

    The file is created and seeded (regions with clear weather, `xp_rate = 1.0`) only
    when it is new; opening an existing file never re-seeds it. Every method is one
    transaction, so the object may be abandoned at any point and a fresh one opened.
    """

    def __init__(self, path: str, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        # Calls may come from the event loop and from worker threads; sqlite3 objects are
        # not safe to share between threads without a lock, so every use takes it.
        self._lock = threading.RLock()
        self._rng: random.Random | None = None
        self._random: dict[FaultKind, float] = {}
        # The faults this object's calls met, by kind (counted knobs and dice alike), for
        # the reliability soak's tally. In memory: it counts what this process saw.
        self.faults_met: Counter[str] = Counter()
        # The crash tests' hook around every operation: called with (op, "before") just
        # before its transaction begins and (op, "after") just after it committed, so a
        # test can kill the process on either side of a world write. None in production.
        self.hook: Callable[[str, str], None] | None = None
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

    def __enter__(self) -> SandboxWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SandboxWorld {self.path!r}>"

    def _create(self) -> None:
        with self._transaction() as db:
            # Statement by statement: executescript() would COMMIT our transaction first.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            seeded = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if seeded is not None:
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

    # -- the fault gate ----------------------------------------------------------------

    def _call(self, op: str, body: Callable[[sqlite3.Connection, bool], T], *, revert: bool = False) -> T:
        """Run `body(db, crashing)` as one transaction, through the fault knobs.

        The knob is consumed in the same transaction as the effect. A `fail` commits only
        the consumption and raises; `lose` and `crash` commit the (whole or half) effect
        and then raise. A body that refuses the call (PermanentError) rolls everything
        back, knob included: a refused call is not a call the knob was aimed at.
        """
        result: T | None = None
        if self.hook is not None:
            self.hook(op, "before")
        with self._transaction() as db:
            fault = self._take_fault(db, op, revert=revert)
            failing = fault is not None and fault.kind in (FaultKind.FAIL, FaultKind.FAIL_REVERT)
            if not failing:
                result = body(db, fault is not None and fault.kind is FaultKind.CRASH)
        if self.hook is not None:
            self.hook(op, "after")
        if fault is not None:
            self.faults_met[fault.kind.value] += 1
        if fault is not None and fault.kind is FaultKind.DUPLICATE:
            # The same request arrives again, as a transport that retried it would deliver
            # it: the key ledger answers it, and this second answer is the one returned.
            with self._transaction() as db:
                again: T = body(db, False)
            return again
        if fault is not None:
            if fault.kind in (FaultKind.FAIL, FaultKind.FAIL_REVERT):
                raise RetryableError(fault.message)
            if fault.kind is FaultKind.LOSE:
                raise AnswerLost(fault.message)
            raise WorldCrashed(fault.message)
        # No fault, or a fault that returned above: body ran, so result holds its T.
        return cast(T, result)

    def _take_fault(self, db: sqlite3.Connection, op: str, *, revert: bool) -> _Fault | None:
        kinds = ("fail_revert",) if revert else ("fail", "lose", "crash")
        rows = db.execute(
            f"SELECT id, kind, action, remaining, message FROM faults"
            f" WHERE kind IN ({','.join('?' * len(kinds))}) ORDER BY id",
            kinds,
        ).fetchall()
        for fault_id, kind, action, remaining, message in rows:
            # Revert knobs match every revert; action knobs match by name.
            if revert or _matches(action, op):
                if remaining > 1:
                    db.execute("UPDATE faults SET remaining = remaining - 1 WHERE id = ?", (fault_id,))
                else:
                    db.execute("DELETE FROM faults WHERE id = ?", (fault_id,))
                return _Fault(FaultKind(kind), message or f"sandbox: injected {kind} ({op})")
        return self._roll(op, revert=revert)

    def _roll(self, op: str, *, revert: bool) -> _Fault | None:
        if self._rng is None:
            return None
        if revert:
            chance = self._random.get(FaultKind.FAIL_REVERT, 0.0)
            if chance and self._rng.random() < chance:
                return _Fault(FaultKind.FAIL_REVERT, f"sandbox: random revert failure ({op})")
            return None
        if op not in ACTION_OPS:
            return None
        roll, edge = self._rng.random(), 0.0
        for kind in (FaultKind.FAIL, FaultKind.LOSE, FaultKind.CRASH, FaultKind.DUPLICATE):
            edge += self._random.get(kind, 0.0)
            if roll < edge:
                return _Fault(kind, f"sandbox: random {kind.value} ({op})")
        return None

    # -- fault knobs -------------------------------------------------------------------

    def _arm(self, kind: FaultKind, n: int, action: str | None, message: str | None) -> None:
        if n < 0:
            raise ValueError("a fault count cannot be negative")
        if n == 0:
            return
        with self._transaction() as db:
            db.execute(
                "INSERT INTO faults (kind, action, remaining, message) VALUES (?, ?, ?, ?)",
                (kind.value, _op_name(action), n, message),
            )

    def fail_next(self, n: int = 1, action: str | None = None, message: str = "sandbox: injected failure") -> None:
        """The next `n` calls of `action` (or of any action) raise RetryableError(message)
        before touching the world. Knobs are met in the order they were armed."""
        self._arm(FaultKind.FAIL, n, action, message)

    def lose_next(self, n: int = 1, action: str | None = None) -> None:
        """The next `n` calls apply their effect and store their answer in the key ledger,
        then raise AnswerLost: the engine sees a lost answer, the world is changed."""
        self._arm(FaultKind.LOSE, n, action, None)

    def crash_next(self, n: int = 1, action: str | None = None) -> None:
        """The next `n` calls apply half their effect and raise WorldCrashed (a
        RuntimeError) without storing an answer.

        Half means the first `count // 2` objects of a spawn or place_item, so a call
        with `count=1` makes nothing; a broadcast, buff or lease write applies nothing.
        """
        self._arm(FaultKind.CRASH, n, action, None)

    def fail_reverts_next(
        self,
        n: int = 1,
        message: str = "sandbox: injected revert failure",
    ) -> None:
        """The next `n` revert calls (remove_creature, remove_item, remove_many,
        revert_key) raise RetryableError before removing anything."""
        self._arm(FaultKind.FAIL_REVERT, n, None, message)

    def delay(self, seconds: float) -> None:
        """Every call made through the module first awaits `clock.sleep(seconds)` (see
        `pace`); 0 turns the delay off."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        with self._transaction() as db:
            db.execute("UPDATE meta SET value = ? WHERE name = 'delay'", (repr(float(seconds)),))

    def current_delay(self) -> float:
        """The delay every call waits, in seconds."""
        with self._transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE name = 'delay'").fetchone()
        return float(row[0])

    async def pace(self) -> None:
        """Wait the configured delay on the world's clock. The module calls this before
        every action, revert and lease call; the world's own methods are synchronous."""
        seconds = self.current_delay()
        if seconds > 0:
            await self.clock.sleep(seconds)

    def set_random_faults(
        self,
        fail: float = 0.0,
        lose: float = 0.0,
        crash: float = 0.0,
        *,
        duplicate: float = 0.0,
        revert_fail: float = 0.0,
        seed: int | None = None,
    ) -> None:
        """Give every action call a chance to fail, lose its answer, crash or be delivered
        twice (and every revert a chance to fail), drawn from `random.Random(seed)`.

        Held in this object's memory, not the file. Counted knobs are met first; the dice
        are only rolled for a call no counted knob applies to. All zero turns them off.
        """
        chances = (("fail", fail), ("lose", lose), ("crash", crash), ("duplicate", duplicate))
        for name, chance in (*chances, ("revert_fail", revert_fail)):
            if not 0.0 <= chance <= 1.0:
                raise ValueError(f"{name} must be a probability, got {chance!r}")
        if fail + lose + crash + duplicate > 1.0:
            raise ValueError("fail + lose + crash + duplicate cannot exceed 1")
        with self._lock:
            self._random = {
                FaultKind.FAIL: fail,
                FaultKind.LOSE: lose,
                FaultKind.CRASH: crash,
                FaultKind.DUPLICATE: duplicate,
                FaultKind.FAIL_REVERT: revert_fail,
            }
            active = any(self._random.values())
            self._rng = random.Random(seed) if active else None

    def clear_faults(self) -> None:
        """Disarm every knob: counted ones, the delay and the random faults."""
        with self._transaction() as db:
            db.execute("DELETE FROM faults")
            db.execute("UPDATE meta SET value = '0' WHERE name = 'delay'")
        self.set_random_faults()

    def pending_faults(self) -> list[dict[str, Any]]:
        """The counted knobs still armed, in the order they will be met."""
        with self._transaction() as db:
            rows = db.execute("SELECT kind, action, remaining, message FROM faults ORDER BY id").fetchall()
        return [{"kind": k, "action": a, "remaining": r, "message": m} for k, a, r, m in rows]

    # -- helpers -----------------------------------------------------------------------

    def _now_iso(self) -> str:
        return self.clock.now().astimezone(UTC).isoformat()

    def _effect(
        self, db: sqlite3.Connection, key: str | None, op: str, kind: str, ref: str, idx: int | None = None
    ) -> None:
        db.execute(
            "INSERT INTO effects (key, op, kind, ref, idx, at) VALUES (?, ?, ?, ?, ?, ?)",
            (key, op, kind, ref, idx, self._now_iso()),
        )

    def _stored(self, db: sqlite3.Connection, key: str, action: str) -> Any:
        """The answer stored for `key`, or None. A key is one step's: reusing it for
        another action is a caller's bug that a retry cannot fix."""
        row = db.execute("SELECT action, answer FROM keys WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if row[0] != action:
            raise PermanentError(f"key {key!r} was used for {row[0]!r}, not {action!r}")
        return json.loads(row[1])

    def _store(self, db: sqlite3.Connection, key: str, action: str, answer: Any) -> None:
        db.execute(
            "INSERT INTO keys (key, action, answer, at) VALUES (?, ?, ?, ?)",
            (key, action, json.dumps(answer), self._now_iso()),
        )

    @staticmethod
    def _require_region(db: sqlite3.Connection, region: str) -> None:
        if db.execute("SELECT 1 FROM regions WHERE name = ?", (region,)).fetchone() is None:
            raise PermanentError(f"sandbox: no region {region!r}")

    @staticmethod
    def _require_key(key: str) -> None:
        if not key:
            raise PermanentError("sandbox: an idempotency key is required")

    def _next_serial(self, db: sqlite3.Connection) -> str:
        (value,) = db.execute("SELECT value FROM meta WHERE name = 'next_serial'").fetchone()
        number = int(value)
        # Skip serials a test planted ahead of the counter with reuse_serial.
        while True:
            serial = f"0x{number:08X}"
            number += 1
            if not any(
                db.execute(f"SELECT 1 FROM {table} WHERE serial = ?", (serial,)).fetchone() for table in TABLES.values()
            ):
                break
        db.execute("UPDATE meta SET value = ? WHERE name = 'next_serial'", (str(number),))
        return serial

    def _make(
        self, db: sqlite3.Connection, kind_of: str, key: str, kind: str, region: str, count: int, upto: int
    ) -> list[str]:
        """Objects idx 0..upto-1 of `key`'s call, making only those not made before."""
        table = TABLES[kind_of]
        serials: list[str] = []
        for idx in range(upto):
            row = db.execute(f"SELECT serial FROM {table} WHERE tag = ? AND idx = ?", (key, idx)).fetchone()
            if row is None:
                # Made by an earlier, crashed attempt and since removed by the world (a
                # player killed it): it was made once, it is not made again.
                row = db.execute(
                    "SELECT ref FROM effects WHERE key = ? AND op = 'create' AND kind = ? AND idx = ?",
                    (key, kind_of, idx),
                ).fetchone()
            if row is not None:
                serials.append(row[0])
                continue
            serial = self._next_serial(db)
            db.execute(
                f"INSERT INTO {table} (serial, kind, region, tag, idx) VALUES (?, ?, ?, ?, ?)",
                (serial, kind, region, key, idx),
            )
            self._effect(db, key, "create", kind_of, serial, idx)
            serials.append(serial)
        return serials

    def _make_call(self, op: str, kind_of: str, key: str, kind: str, region: str, count: int) -> list[str]:
        self._require_key(key)
        if count < 1:
            raise PermanentError(f"sandbox: count must be at least 1, got {count}")
        if not kind:
            raise PermanentError("sandbox: kind is required")

        def body(db: sqlite3.Connection, crashing: bool) -> list[str]:
            stored = self._stored(db, key, op)
            if stored is not None:
                return [str(s) for s in stored]
            self._require_region(db, region)
            serials = self._make(db, kind_of, key, kind, region, count, count // 2 if crashing else count)
            if not crashing:
                self._store(db, key, op, serials)
            return serials

        return self._call(op, body)

    # -- actions -----------------------------------------------------------------------

    def spawn(self, key: str, kind: str, region: str, count: int = 1) -> list[str]:
        """Make `count` creatures of `kind` in `region` for `key`; their serials, in order.

        Exactly once per (key, idx): a key with a stored answer gets it back untouched; a
        key that half-ran makes only its missing creatures and answers all of them.
        An unknown region raises PermanentError.
        """
        return self._make_call("spawn", "creature", key, kind, region, count)

    def place_item(self, key: str, kind: str, region: str, count: int = 1) -> list[str]:
        """Place `count` items of `kind` in `region` for `key`; exactly like `spawn`."""
        return self._make_call("place_item", "item", key, kind, region, count)

    def broadcast(self, key: str, message: str, region: str | None = None) -> int:
        """Say `message` (to `region`, or everyone) once per key; the broadcast's id."""
        self._require_key(key)

        def body(db: sqlite3.Connection, crashing: bool) -> int:
            stored = self._stored(db, key, "broadcast")
            if stored is not None:
                return int(stored["id"])
            if region is not None:
                self._require_region(db, region)
            if crashing:
                return 0
            cursor = db.execute(
                "INSERT INTO broadcasts (message, region, at, tag) VALUES (?, ?, ?, ?)",
                (message, region, self._now_iso(), key),
            )
            broadcast_id = int(cursor.lastrowid or 0)
            self._effect(db, key, "create", "broadcast", str(broadcast_id))
            self._store(db, key, "broadcast", {"id": broadcast_id})
            return broadcast_id

        return self._call("broadcast", body)

    def buff(self, key: str, name: str, region: str, seconds: float) -> dict[str, Any]:
        """Put buff `name` on `region` for `seconds` of the clock, once per key.

        Answers {"name", "region", "expires_at" (ISO)}. The buff undoes itself: it leaves
        the snapshot once the clock passes its expiry.
        """
        self._require_key(key)
        if seconds < 0:
            raise PermanentError("sandbox: a buff cannot last a negative time")

        def body(db: sqlite3.Connection, crashing: bool) -> dict[str, Any]:
            stored = self._stored(db, key, "buff")
            if stored is not None:
                return dict(stored)
            self._require_region(db, region)
            expires = self.clock.now() + timedelta(seconds=seconds)
            answer = {"name": name, "region": region, "expires_at": expires.isoformat()}
            if crashing:
                return answer
            db.execute(
                "INSERT INTO buffs (name, region, expires_at, tag) VALUES (?, ?, ?, ?)",
                (name, region, expires.timestamp(), key),
            )
            self._effect(db, key, "create", "buff", f"{name}#{region}")
            self._store(db, key, "buff", answer)
            return answer

        return self._call("buff", body)

    # -- reverts -----------------------------------------------------------------------

    def _remove(self, db: sqlite3.Connection, kind_of: str, serial: str, key: str) -> bool:
        cursor = db.execute(f"DELETE FROM {TABLES[kind_of]} WHERE serial = ? AND tag = ?", (serial, key))
        if cursor.rowcount:
            self._effect(db, key, "remove", kind_of, serial)
            return True
        return False

    def remove_creature(self, serial: str, key: str) -> bool:
        """Remove creature `serial` if it exists and was made by `key`.

        True when it was removed; False when it is gone already or carries another
        key's tag (the serial was reused) — both are a success, not an error.
        """
        return self._call("remove_creature", lambda db, _c: self._remove(db, "creature", serial, key), revert=True)

    def remove_item(self, serial: str, key: str) -> bool:
        """Remove item `serial` if it exists and was made by `key`; like remove_creature."""
        return self._call("remove_item", lambda db, _c: self._remove(db, "item", serial, key), revert=True)

    def remove_many(self, key: str, refs: Sequence[tuple[str, str]]) -> list[bool]:
        """Remove each `(kind, serial)` ('creature' or 'item') made by `key`, in order, in
        one transaction and one revert call; one bool per ref as in remove_creature."""
        for kind_of, _serial in refs:
            if kind_of not in TABLES:
                raise ValueError(f"sandbox: cannot remove a {kind_of!r}")
        return self._call(
            "remove_many",
            lambda db, _c: [self._remove(db, kind_of, serial, key) for kind_of, serial in refs],
            revert=True,
        )

    def revert_key(self, key: str) -> list[tuple[str, str]]:
        """Remove every creature and item tagged with `key`, newest first; what was removed,
        as `(kind, serial)`. Used when the engine reverts with no resources (its record of
        the answer was lost): the world knows what the key made by the tag."""

        def body(db: sqlite3.Connection, _crashing: bool) -> list[tuple[str, str]]:
            removed: list[tuple[str, str]] = []
            for kind_of in ("item", "creature"):
                rows = db.execute(
                    f"SELECT serial FROM {TABLES[kind_of]} WHERE tag = ? ORDER BY idx DESC, serial DESC", (key,)
                ).fetchall()
                for (serial,) in rows:
                    if self._remove(db, kind_of, serial, key):
                        removed.append((kind_of, serial))
            return removed

        return self._call("revert_key", body, revert=True)

    # -- the world's own doings (no key, no knobs) ---------------------------------------

    def add_region(self, name: str, weather: str = "clear") -> None:
        """Open a new region, as a world's admin would (a test wanting more lease targets
        than the five seeded regions). A region that exists is left as it is."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO regions (name, weather) VALUES (?, ?)", (name, weather))

    def destroy(self, serial: str) -> bool:
        """Remove creature or item `serial` whatever its tag, as a player killing a creature
        or a world rollback would. True when something was there."""
        with self._transaction() as db:
            for kind_of, table in TABLES.items():
                cursor = db.execute(f"DELETE FROM {table} WHERE serial = ?", (serial,))
                if cursor.rowcount:
                    self._effect(db, None, "remove", kind_of, serial)
                    return True
        return False

    def reuse_serial(self, serial: str, kind: str, region: str, tag: str | None, *, kind_of: str = "creature") -> None:
        """Plant a foreign object under `serial`, as a game server reusing a freed serial.

        Whatever held the serial is replaced. The planted object has `tag` and no idx, so
        it never counts as part of any key's call; the counter moves past it.
        """
        if kind_of not in TABLES:
            raise ValueError(f"sandbox: cannot plant a {kind_of!r}")
        with self._transaction() as db:
            for table in TABLES.values():
                db.execute(f"DELETE FROM {table} WHERE serial = ?", (serial,))
            db.execute(
                f"INSERT INTO {TABLES[kind_of]} (serial, kind, region, tag, idx) VALUES (?, ?, ?, ?, NULL)",
                (serial, kind, region, tag),
            )
            self._effect(db, None, "create", kind_of, serial)
            try:
                number = int(serial, 16)
            except ValueError:
                return
            db.execute(
                "UPDATE meta SET value = ? WHERE name = 'next_serial' AND CAST(value AS INTEGER) <= ?",
                (str(number + 1), number),
            )

    # -- lease targets -----------------------------------------------------------------

    def read_weather(self, region: str) -> str:
        """The weather of `region`; PermanentError for an unknown region."""

        def body(db: sqlite3.Connection, _crashing: bool) -> str:
            row = db.execute("SELECT weather FROM regions WHERE name = ?", (region,)).fetchone()
            if row is None:
                raise PermanentError(f"sandbox: no region {region!r}")
            return str(row[0])

        return self._call("weather.read", body)

    def set_weather(self, region: str, value: str) -> None:
        """Set the weather of `region`; PermanentError for an unknown region."""

        def body(db: sqlite3.Connection, crashing: bool) -> None:
            self._require_region(db, region)
            if crashing:
                return
            db.execute("UPDATE regions SET weather = ? WHERE name = ?", (value, region))
            self._effect(db, None, "set", "weather", region)

        self._call("weather.write", body)

    def read_setting(self, name: str) -> Any:
        """The value of setting `name`; PermanentError for an unknown setting."""

        def body(db: sqlite3.Connection, _crashing: bool) -> Any:
            row = db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise PermanentError(f"sandbox: no setting {name!r}")
            return json.loads(row[0])

        return self._call(f"{name}.read", body)

    def set_setting(self, name: str, value: Any) -> None:
        """Set setting `name` to the JSON value `value`, creating it if new."""
        encoded = json.dumps(value)

        def body(db: sqlite3.Connection, crashing: bool) -> None:
            if crashing:
                return
            db.execute(
                "INSERT INTO settings (name, value) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, encoded),
            )
            self._effect(db, None, "set", "setting", name)

        self._call(f"{name}.write", body)

    # -- the dispatch log ----------------------------------------------------------------

    def enable_dispatch_log(self, on: bool = True) -> None:
        """Record, from now on, when each action call began and ended and in which process.

        Off by default. The flag is a row in the file, so every process serving it logs;
        the multi-process tests read the log to prove no key was in two calls at once.
        """
        with self._transaction() as db:
            db.execute(
                "INSERT INTO meta (name, value) VALUES ('dispatch_log', ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                ("1" if on else "0",),
            )

    @asynccontextmanager
    async def dispatching(self, key: str, op: str) -> AsyncIterator[None]:
        """Wrap one action call (its pacing delay included) in the dispatch log, when on.

        A call cut short (cancelled, raised) still gets its end; a process killed inside
        the call leaves it open, and its kill time is its end.
        """
        with self._transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE name = 'dispatch_log'").fetchone()
            entry: int | None = None
            if row is not None and row[0] == "1":
                cursor = db.execute(
                    "INSERT INTO dispatches (key, op, pid, started) VALUES (?, ?, ?, ?)",
                    (key, op, os.getpid(), self.clock.now().timestamp()),
                )
                entry = cursor.lastrowid
        try:
            yield
        finally:
            if entry is not None:
                with self._transaction() as db:
                    db.execute("UPDATE dispatches SET ended = ? WHERE id = ?", (self.clock.now().timestamp(), entry))

    def dispatches(self) -> list[dict[str, Any]]:
        """The dispatch log, oldest first: `{"id", "key", "op", "pid", "started", "ended"}`
        with times as POSIX seconds on the world's clock; `ended` is None for a call whose
        process died inside it."""
        with self._transaction() as db:
            rows = db.execute("SELECT id, key, op, pid, started, ended FROM dispatches ORDER BY id").fetchall()
        names = ("id", "key", "op", "pid", "started", "ended")
        return [dict(zip(names, row, strict=True)) for row in rows]

    # -- readers -----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The world's state, for comparing before and after a run.

        `{"regions": {name: weather}, "settings": {name: value},
        "creatures": {serial: {"kind", "region"}}, "items": {serial: {"kind", "region"}},
        "buffs": [{"name", "region", "expires_at"}] (active only, sorted)}`. Logs (the
        broadcasts, the key ledger, the effects) are not world state and are left out.
        """
        now = self.clock.now().timestamp()
        with self._transaction() as db:
            regions = dict(db.execute("SELECT name, weather FROM regions ORDER BY name"))
            settings = {
                name: json.loads(value) for name, value in db.execute("SELECT name, value FROM settings ORDER BY name")
            }
            objects = {
                table: {
                    serial: {"kind": kind, "region": region}
                    for serial, kind, region in db.execute(f"SELECT serial, kind, region FROM {table} ORDER BY serial")
                }
                for table in TABLES.values()
            }
            buffs = [
                {"name": name, "region": region, "expires_at": datetime.fromtimestamp(expires, UTC).isoformat()}
                for name, region, expires in db.execute(
                    "SELECT name, region, expires_at FROM buffs WHERE expires_at > ? ORDER BY name, region, expires_at",
                    (now,),
                )
            ]
        return {
            "regions": regions,
            "settings": settings,
            "creatures": objects["creatures"],
            "items": objects["items"],
            "buffs": buffs,
        }

    def effects(self) -> list[dict[str, Any]]:
        """Every effect the world underwent, oldest first:
        `{"id", "key", "op" ('create'|'remove'|'set'), "kind", "ref", "idx", "at"}`."""
        with self._transaction() as db:
            rows = db.execute("SELECT id, key, op, kind, ref, idx, at FROM effects ORDER BY id").fetchall()
        names = ("id", "key", "op", "kind", "ref", "idx", "at")
        return [dict(zip(names, row, strict=True)) for row in rows]

    def key_ledger(self) -> dict[str, dict[str, Any]]:
        """Stored answers by key, oldest first: `{key: {"action", "answer", "at"}}`."""
        with self._transaction() as db:
            rows = db.execute("SELECT key, action, answer, at FROM keys ORDER BY rowid")
            return {key: {"action": action, "answer": json.loads(answer), "at": at} for key, action, answer, at in rows}

    def broadcasts(self) -> list[dict[str, Any]]:
        """The broadcast log, oldest first: `{"id", "message", "region", "at", "tag"}`."""
        with self._transaction() as db:
            rows = db.execute("SELECT id, message, region, at, tag FROM broadcasts ORDER BY id").fetchall()
        names = ("id", "message", "region", "at", "tag")
        return [dict(zip(names, row, strict=True)) for row in rows]

    def tag_of(self, serial: str) -> str | None:
        """The key that made creature or item `serial` (None when absent or untagged)."""
        with self._transaction() as db:
            for table in TABLES.values():
                row = db.execute(f"SELECT tag FROM {table} WHERE serial = ?", (serial,)).fetchone()
                if row is not None:
                    return None if row[0] is None else str(row[0])
        return None

    def inspect(self, refs: Sequence[tuple[str, str]]) -> list[tuple[bool, str | None]]:
        """For each `(kind_of, serial)`: whether that object exists, and the tag it carries."""
        found: list[tuple[bool, str | None]] = []
        with self._transaction() as db:
            for kind_of, serial in refs:
                table = TABLES.get(kind_of)
                row = db.execute(f"SELECT tag FROM {table} WHERE serial = ?", (serial,)).fetchone() if table else None
                found.append((False, None) if row is None else (True, None if row[0] is None else str(row[0])))
        return found


def open_world(path: str, clock: Clock) -> SandboxWorld:
    """Open (creating and seeding if new) the sandbox world in the file at `path`."""
    return SandboxWorld(path, clock)

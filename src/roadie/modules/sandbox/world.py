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
- **Fenced.** Every call that changes the world on the engine's behalf carries the fence
  of the claim it is made under (docs/protocol.md §4, rule 7): per step key, and per lease
  target (`weather#<region>`, a setting's name), the file keeps the highest fence it has
  accepted, its mark, and refuses a lower one with `Superseded` before anything else,
  in the same transaction as the effect and the key ledger. Fence 0 (a call no claim
  stands behind: a test, a person at the console) is never refused and raises no mark.
- **Crash-safe.** WAL mode, one transaction per operation, nothing cached in memory: a
  fresh object on the same file, after the previous one was abandoned, sees exactly
  what was committed.

Its file, schema and transactions are in `file.py`; the fault knobs that make it
misbehave on purpose in `faults.py`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from roadie.clock import Clock
from roadie.errors import PermanentError, Superseded
from roadie.modules.sandbox.faults import FaultGate, WorldCrashed
from roadie.modules.sandbox.file import SEED_REGIONS, TABLES
from roadie.protocol import lease_fence_target

__all__ = ["SEED_REGIONS", "SandboxWorld", "WorldCrashed", "open_world"]

_UNSET: Any = object()  # no default given


class SandboxWorld(FaultGate):
    """A small world in its own SQLite file at `path`, reading time from `clock`.

    The file is created and seeded (regions with clear weather, `xp_rate = 1.0`, an empty `motd`) only
    when it is new; opening an existing file never re-seeds it. Every method is one
    transaction, so the object may be abandoned at any point and a fresh one opened.
    """

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

    @staticmethod
    def _fenced(db: sqlite3.Connection, kind: str, target: str, fence: int) -> None:
        """Refuse a call whose fence is lower than the mark of its target (`kind` 'key' for
        a step's key, 'lease' for a lease target); else raise the mark to it. Run first in
        the call's transaction: a refused call rolls back having done nothing."""
        if fence <= 0:
            return
        row = db.execute("SELECT mark FROM fences WHERE kind = ? AND target = ?", (kind, target)).fetchone()
        if row is not None and fence < row[0]:
            raise Superseded(
                f"sandbox: fence {fence} is older than fence {row[0]}, already accepted for {target}:"
                " a newer owner has acted",
                mark=row[0],
            )
        db.execute(
            "INSERT INTO fences (kind, target, mark) VALUES (?, ?, ?)"
            " ON CONFLICT (kind, target) DO UPDATE SET mark = excluded.mark WHERE excluded.mark > fences.mark",
            (kind, target, fence),
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

    def _make_call(self, op: str, kind_of: str, key: str, kind: str, region: str, count: int, fence: int) -> list[str]:
        self._require_key(key)
        if count < 1:
            raise PermanentError(f"sandbox: count must be at least 1, got {count}")
        if not kind:
            raise PermanentError("sandbox: kind is required")

        def body(db: sqlite3.Connection, crashing: bool) -> list[str]:
            self._fenced(db, "key", key, fence)
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

    def spawn(self, key: str, kind: str, region: str, count: int = 1, *, fence: int = 0) -> list[str]:
        """Make `count` creatures of `kind` in `region` for `key`; their serials, in order.

        Exactly once per (key, idx): a key with a stored answer gets it back untouched; a
        key that half-ran makes only its missing creatures and answers all of them.
        An unknown region raises PermanentError; a `fence` lower than the key's mark
        raises Superseded, before a stored answer is looked at.
        """
        return self._make_call("spawn", "creature", key, kind, region, count, fence)

    def place_item(self, key: str, kind: str, region: str, count: int = 1, *, fence: int = 0) -> list[str]:
        """Place `count` items of `kind` in `region` for `key`; exactly like `spawn`."""
        return self._make_call("place_item", "item", key, kind, region, count, fence)

    def broadcast(self, key: str, message: str, region: str | None = None, *, fence: int = 0) -> int:
        """Say `message` (to `region`, or everyone) once per key; the broadcast's id."""
        self._require_key(key)

        def body(db: sqlite3.Connection, crashing: bool) -> int:
            self._fenced(db, "key", key, fence)
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

    def buff(self, key: str, name: str, region: str, seconds: float, *, fence: int = 0) -> dict[str, Any]:
        """Put buff `name` on `region` for `seconds` of the clock, once per key.

        Answers {"name", "region", "expires_at" (ISO)}. The buff undoes itself: it leaves
        the snapshot once the clock passes its expiry.
        """
        self._require_key(key)
        if seconds < 0:
            raise PermanentError("sandbox: a buff cannot last a negative time")

        def body(db: sqlite3.Connection, crashing: bool) -> dict[str, Any]:
            self._fenced(db, "key", key, fence)
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

    def _schedule_respawn(self, db: sqlite3.Connection, kind: str, region: str, tag: str | None) -> None:
        """A tagged creature of a kind with a respawn timer that is killed comes back,
        tagged the same, once the timer runs out: the world's own doing, which no ledger
        row will name. (A revert despawns, which starts no timer; one already running runs
        on, as on a real server.)"""
        rule = db.execute("SELECT seconds FROM respawn_rules WHERE kind = ?", (kind,)).fetchone()
        if rule is not None and tag is not None:
            due = self.clock.now().timestamp() + float(rule[0])
            db.execute("INSERT INTO respawns (kind, region, tag, due) VALUES (?, ?, ?, ?)", (kind, region, tag, due))

    def _wake(self, db: sqlite3.Connection) -> None:
        """Carry out the respawns that are due: the world's clock moves even when nobody
        calls it, and whoever looks next sees what it did meanwhile."""
        due = db.execute(
            "SELECT id, kind, region, tag FROM respawns WHERE due <= ? ORDER BY id", (self.clock.now().timestamp(),)
        ).fetchall()
        for respawn_id, kind, region, tag in due:
            serial = self._next_serial(db)
            db.execute(
                "INSERT INTO creatures (serial, kind, region, tag, idx) VALUES (?, ?, ?, ?, NULL)",
                (serial, kind, region, tag),
            )
            self._effect(db, tag, "create", "creature", serial)
            db.execute("DELETE FROM respawns WHERE id = ?", (respawn_id,))

    def _remove_one(self, op: str, kind_of: str, serial: str, key: str, fence: int) -> bool:
        def body(db: sqlite3.Connection, _crashing: bool) -> bool:
            self._fenced(db, "key", key, fence)
            return self._remove(db, kind_of, serial, key)

        return self._call(op, body, revert=True)

    def remove_creature(self, serial: str, key: str, *, fence: int = 0) -> bool:
        """Remove creature `serial` if it exists and was made by `key`.

        True when it was removed; False when it is gone already or carries another
        key's tag (the serial was reused) — both are a success, not an error. A `fence`
        lower than the key's mark raises Superseded and removes nothing.
        """
        return self._remove_one("remove_creature", "creature", serial, key, fence)

    def remove_item(self, serial: str, key: str, *, fence: int = 0) -> bool:
        """Remove item `serial` if it exists and was made by `key`; like remove_creature."""
        return self._remove_one("remove_item", "item", serial, key, fence)

    def remove_many(self, key: str, refs: Sequence[tuple[str, str]], *, fence: int = 0) -> list[bool]:
        """Remove each `(kind, serial)` ('creature' or 'item') made by `key`, in order, in
        one transaction and one revert call; one bool per ref as in remove_creature."""
        for kind_of, _serial in refs:
            if kind_of not in TABLES:
                raise ValueError(f"sandbox: cannot remove a {kind_of!r}")

        def body(db: sqlite3.Connection, _crashing: bool) -> list[bool]:
            self._fenced(db, "key", key, fence)
            return [self._remove(db, kind_of, serial, key) for kind_of, serial in refs]

        return self._call("remove_many", body, revert=True)

    def revert_key(self, key: str, *, fence: int = 0) -> list[tuple[str, str]]:
        """Remove every creature and item tagged with `key`, newest first; what was removed,
        as `(kind, serial)`. Used when the engine reverts with no resources (its record of
        the answer was lost): the world knows what the key made by the tag."""

        def body(db: sqlite3.Connection, _crashing: bool) -> list[tuple[str, str]]:
            self._fenced(db, "key", key, fence)
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
                row = db.execute(f"SELECT kind, region, tag FROM {table} WHERE serial = ?", (serial,)).fetchone()
                if row is not None:
                    db.execute(f"DELETE FROM {table} WHERE serial = ?", (serial,))
                    self._effect(db, None, "remove", kind_of, serial)
                    if kind_of == "creature":
                        self._schedule_respawn(db, row[0], row[1], row[2])
                    return True
        return False

    def summon(self, serial: str, kind: str, count: int = 1) -> list[str]:
        """Creature `serial` summons `count` creatures of `kind` beside it, tagged with its
        own tag, as an event boss calling minions would: the world's doing, reported to
        no one, so no ledger row names them. What was summoned, by serial."""
        with self._transaction() as db:
            self._wake(db)
            row = db.execute("SELECT region, tag FROM creatures WHERE serial = ?", (serial,)).fetchone()
            if row is None:
                raise PermanentError(f"sandbox: no creature {serial} to summon anything")
            made = []
            for _ in range(count):
                made.append(self._next_serial(db))
                db.execute(
                    "INSERT INTO creatures (serial, kind, region, tag, idx) VALUES (?, ?, ?, ?, NULL)",
                    (made[-1], kind, row[0], row[1]),
                )
                self._effect(db, row[1], "create", "creature", made[-1])
            return made

    def respawn_after(self, kind: str, seconds: float | None) -> None:
        """Give creatures of `kind` a respawn timer: a tagged one killed (`destroy`) comes
        back `seconds` later with the same tag. None takes the timer off."""
        with self._transaction() as db:
            if seconds is None:
                db.execute("DELETE FROM respawn_rules WHERE kind = ?", (kind,))
            else:
                db.execute("INSERT OR REPLACE INTO respawn_rules (kind, seconds) VALUES (?, ?)", (kind, seconds))

    def tagged(self, after: str | None, limit: int) -> tuple[list[tuple[str, str, str, str, str]], str | None]:
        """A page of the creatures and items that carry a tag, in serial order after the
        serial `after`: `(kind_of, serial, tag, kind, region)` each, and the serial the
        next page begins after (None when this page is the last)."""
        with self._transaction() as db:
            self._wake(db)
            rows = db.execute(
                "SELECT kind_of, serial, tag, kind, region FROM ("
                " SELECT 'creature' AS kind_of, serial, tag, kind, region FROM creatures WHERE tag IS NOT NULL"
                " UNION ALL"
                " SELECT 'item', serial, tag, kind, region FROM items WHERE tag IS NOT NULL"
                ") WHERE serial > ? ORDER BY serial LIMIT ?",
                (after or "", limit),
            ).fetchall()
        page = [(str(a), str(b), str(c), str(d), str(e)) for a, b, c, d, e in rows]
        return page, (page[-1][1] if len(page) == limit else None)

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

    def set_weather(self, region: str, value: str, *, fence: int = 0) -> None:
        """Set the weather of `region`; PermanentError for an unknown region. `fence` is
        counted for the lease target `weather#<region>`: a lower one than its mark raises
        Superseded and writes nothing."""

        def body(db: sqlite3.Connection, crashing: bool) -> None:
            self._fenced(db, "lease", lease_fence_target("weather", region), fence)
            self._require_region(db, region)
            if crashing:
                return
            db.execute("UPDATE regions SET weather = ? WHERE name = ?", (value, region))
            self._effect(db, None, "set", "weather", region)

        self._call("weather.write", body)

    def read_setting(self, name: str, default: Any = _UNSET) -> Any:
        """The value of setting `name`; `default`, or PermanentError, for one never set."""

        def body(db: sqlite3.Connection, _crashing: bool) -> Any:
            row = db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
            if row is None:
                if default is not _UNSET:
                    return default
                raise PermanentError(f"sandbox: no setting {name!r}")
            return json.loads(row[0])

        return self._call(f"{name}.read", body)

    def set_setting(self, name: str, value: Any, *, fence: int = 0) -> None:
        """Set setting `name` to the JSON value `value`, creating it if new. `fence` is
        counted for the lease target of the same name, as in set_weather."""
        encoded = json.dumps(value)

        def body(db: sqlite3.Connection, crashing: bool) -> None:
            self._fenced(db, "lease", lease_fence_target(name, None), fence)
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
            self._wake(db)
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

    def fences(self) -> dict[tuple[str, str], int]:
        """The marks: the highest fence accepted per `(kind, target)`, kind 'key' or 'lease'."""
        with self._transaction() as db:
            rows = db.execute("SELECT kind, target, mark FROM fences ORDER BY kind, target").fetchall()
        return {(str(kind), str(target)): int(mark) for kind, target, mark in rows}

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
            self._wake(db)
            for kind_of, serial in refs:
                table = TABLES.get(kind_of)
                row = db.execute(f"SELECT tag FROM {table} WHERE serial = ?", (serial,)).fetchone() if table else None
                found.append((False, None) if row is None else (True, None if row[0] is None else str(row[0])))
        return found


def open_world(path: str, clock: Clock) -> SandboxWorld:
    """Open (creating and seeding if new) the sandbox world in the file at `path`."""
    return SandboxWorld(path, clock)

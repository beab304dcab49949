"""Fault knobs: they make the sandbox world misbehave on purpose.

The counted knobs (`fail_next`, `lose_next`, `crash_next`, `fail_reverts_next`) and
`delay` are rows in the world file, so a fresh object or another process serving the
same file sees them; `set_random_faults` lives in the object's memory, because a seeded
random stream cannot be shared between processes and stay reproducible.

For the reliability tests, `faults_met` counts the faults this object's calls met by
kind, and `hook`, when set, is called on either side of every operation's transaction
(the crash tests kill the process there).
"""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, cast

from roadie.clock import Clock
from roadie.errors import AnswerLost, RetryableError
from roadie.modules.sandbox.file import WorldFile

T = TypeVar("T")

# The world's own operations, by the names the fault knobs match on. A knob armed with
# `action=None` matches any of ACTION_OPS; lease reads and writes are only hit by a knob
# that names them (`weather`, `weather.write`, `xp_rate.read`...), so arming "fail the
# next spawn" never breaks the engine's lease bookkeeping by accident.
ACTION_OPS = frozenset({"spawn", "place_item", "broadcast", "buff"})


class FaultKind(StrEnum):
    """What an armed knob does to the call that meets it."""

    FAIL = "fail"  # raise RetryableError before touching the world
    LOSE = "lose"  # apply, store the answer, then raise AnswerLost
    CRASH = "crash"  # apply half, store no answer, raise WorldCrashed
    FAIL_REVERT = "fail_revert"  # a revert raises RetryableError before touching the world
    LOSE_REVERT = "lose_revert"  # a revert (or a named lease write) answers, and the world loses it
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


class FaultGate(WorldFile):
    """A world file whose operations pass through the fault knobs (`_call`), and the
    knobs themselves."""

    def __init__(self, path: str, clock: Clock) -> None:
        self._rng: random.Random | None = None
        self._random: dict[FaultKind, float] = {}
        # The faults this object's calls met, by kind (counted knobs and dice alike), for
        # the reliability soak's tally. In memory: it counts what this process saw.
        self.faults_met: Counter[str] = Counter()
        # The crash tests' hook around every operation: called with (op, "before") just
        # before its transaction begins and (op, "after") just after it committed, so a
        # test can kill the process on either side of a world write. None in production.
        self.hook: Callable[[str, str], None] | None = None
        super().__init__(path, clock)

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
            self._wake(db)
            fault = self._take_fault(db, op, revert=revert)
            failing = fault is not None and fault.kind in (FaultKind.FAIL, FaultKind.FAIL_REVERT)
            if fault is not None and fault.kind is FaultKind.LOSE_REVERT:
                # Done and answered, then lost with the world's unsaved state: what the
                # call did is undone, and only the knob's consumption is kept.
                db.execute("SAVEPOINT lost")
                result = body(db, False)
                db.execute("ROLLBACK TO lost")
                db.execute("RELEASE lost")
                self.faults_met[FaultKind.LOSE_REVERT.value] += 1
                fault = None
            elif not failing:
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
        kinds = ("fail_revert", "lose_revert") if revert else ("fail", "lose", "crash", "lose_revert")
        rows = db.execute(
            f"SELECT id, kind, action, remaining, message FROM faults"
            f" WHERE kind IN ({','.join('?' * len(kinds))}) ORDER BY id",
            kinds,
        ).fetchall()
        for fault_id, kind, action, remaining, message in rows:
            # Revert knobs match every revert; action knobs match by name; a lost revert
            # knob matches every revert, or the lease writes it names.
            if kind == FaultKind.LOSE_REVERT.value:
                hit = (revert and action is None) or (action is not None and _matches(action, op))
            else:
                hit = revert or _matches(action, op)
            if hit:
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

    def lose_reverts_next(self, n: int = 1, action: str | None = None) -> None:
        """The next `n` reverts answer as if done, and the world loses them: nothing is
        removed, as a server that crashed before saving its removals comes back from its
        last save. With `action` naming a lease (`weather`, `xp_rate`), its next `n`
        writes are lost instead, as a restore of that setting would be."""
        self._arm(FaultKind.LOSE_REVERT, n, action, None)

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

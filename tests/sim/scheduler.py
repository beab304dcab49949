"""The seeded scheduler's machinery: actors, gates, and the gated store.

Every actor (an engine's tick, a staff click, a late report...) is an asyncio task. It
runs until it reaches a *gate* — before every call into the store, and before every
touch of the world — and waits there until the scheduler releases it. The scheduler
releases one gate at a time and then waits until every task is parked again (or done):
so only one actor ever runs between two gates, one store transaction is under way at a
time, and the order of everything is the scheduler's choice, taken from its seed.

A crash is decided when a gate before a store write is released: the store's
`write_point` hook then raises `Crash` just before that transaction commits, the
transaction is rolled back, and every task of that engine is cancelled.

A worker cut off from the database (`Slot.cut`) goes on running: each of its store
calls, once released, raises `StoreError` as the store does when its connection is lost
for good (after its reconnect attempts), and nothing reaches the database; its calls to
the world go on, and land.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from roadie.engine import Engine
from roadie.errors import StoreError
from roadie.store import CleanupClaim, Store

SPIN = 20  # loop turns without any progress before the scheduler calls the loop quiet
# The store's methods that write (each passes a named write point before its commit).
WRITES = frozenset(
    {
        "abandon_resource",
        "advance_runs",
        "claim_borrow_in_force",
        "claim_cleanup",
        "claim_expired_lease",
        "claim_lease_row",
        "claim_steps",
        "create_run",
        "deregister_worker",
        "extend_cleanup_claim",
        "finish_cleanup",
        "heartbeat_worker",
        "mark_lease_restored",
        "mark_reverted",
        "record_late_resources",
        "record_and_claim",
        "record_outcomes",
        "register_worker",
        "release_borrow",
        "release_lease_row",
        "request_cancel",
        "requeue_expired_claims",
        "save_lease_value",
        "tell_world",
    }
)


class Crash(BaseException):
    """The engine's process died at a write point. A BaseException, like the signal that
    kills a process: no `except Exception` in the engine may catch it and carry on."""


@dataclass(eq=False)
class Slot:
    """One engine (a worker process) of the simulation, with its own store object."""

    name: str  # "w0", "w1", ..., "web"
    worker_id: str
    store: Store
    gated: Any  # the GatedStore the engine is given
    engine: Engine
    dead: bool = False
    stopping: bool = False  # shutting down: it starts nothing more
    armed: bool = False  # the next commit of this store crashes
    cut: bool = False  # cut off from the database: its store calls fail, its world calls land
    crashed_at: str | None = None
    actors: list[Actor] = field(default_factory=list)

    def running(self, kind: str) -> bool:
        return any(a.kind == kind and a.status == "running" for a in self.actors)


@dataclass(eq=False)
class Actor:
    name: str
    kind: str
    slot: Slot | None
    status: str = "running"  # running | ok | crashed | cancelled | error
    error: str | None = None
    # Cleanups this actor holds: run id -> when its claim expires, as the database has it.
    claims: dict[int, datetime] = field(default_factory=dict)
    # Lease rows this actor took to restore as expired: row id -> when that claim runs out.
    leases: dict[int, datetime] = field(default_factory=dict)
    # Run id -> the actors whose claim on that run's cleanup was still good when this one took it.
    overlapped: dict[int, set[str]] = field(default_factory=dict)
    speed: float = 1.0  # how likely the scheduler is to release it, against the others: a slow one stalls
    task: asyncio.Task[None] | None = None

    @property
    def died(self) -> bool:
        """Whether this actor stopped without finishing: a crash, a cancel, an error raised
        midway. What it did in the world may be done again by whoever takes over."""
        return self.status in ("crashed", "cancelled", "error")


@dataclass(eq=False)
class Parked:
    label: str
    actor: Actor
    future: asyncio.Future[None]
    write: str | None  # the store write this gate is before, if any


current: contextvars.ContextVar[Actor | None] = contextvars.ContextVar("sim_actor", default=None)


class Gates:
    """Parked actors, the loop's quiet, and the actors' lives."""

    def __init__(self, seconds: Callable[[], float]) -> None:
        self.parked: list[Parked] = []
        self.actors: list[Actor] = []
        self.activity = 0
        self.busy = 0
        self.writes = 0  # store writes finished (committed or not): the database may have changed
        self.seconds = seconds
        self._idle: asyncio.Future[None] | None = None
        self.crashes: list[str] = []
        # Told of every store call that returned: (method, args, kwargs, result).
        self.observe: Callable[[str, tuple[Any, ...], dict[str, Any], Any], None] | None = None
        self.counts: dict[str, int] = {}

    def actor_name(self, base: str) -> str:
        n = self.counts.get(base, 0) + 1
        self.counts[base] = n
        return f"{base}#{n}"

    async def gate(self, what: str, write: str | None = None) -> None:
        actor = current.get()
        if actor is None:  # the scheduler's own reads are not actors
            return
        if actor.slot is not None and actor.slot.dead:
            raise asyncio.CancelledError()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parked = Parked(f"{actor.name}: {what}", actor, future, write)
        self.parked.append(parked)
        self.activity += 1
        try:
            await future
        finally:
            if parked in self.parked:
                self.parked.remove(parked)
        if actor.slot is not None and actor.slot.dead:
            raise asyncio.CancelledError()

    def release(self, parked: Parked, *, crash: bool = False) -> None:
        self.parked.remove(parked)
        if crash and parked.actor.slot is not None:
            parked.actor.slot.armed = True
        parked.future.set_result(None)
        self.activity += 1

    def spawn(self, base: str, kind: str, slot: Slot | None, work: Callable[[], Awaitable[Any]]) -> Actor:
        actor = Actor(self.actor_name(base), kind, slot)

        async def body() -> None:
            current.set(actor)
            try:
                await work()
                actor.status = "ok"
            except Crash:
                actor.status = "crashed"
            except asyncio.CancelledError:
                actor.status = "crashed" if actor.slot is not None and actor.slot.dead else "cancelled"
            except Exception as exc:
                actor.status = "error"
                actor.error = type(exc).__name__
            finally:
                self.activity += 1

        actor.task = asyncio.get_running_loop().create_task(body())
        self.actors.append(actor)
        if slot is not None:
            slot.actors.append(actor)
        self.activity += 1
        return actor

    def kill(self, slot: Slot, why: str) -> None:
        """The engine's process is gone: every task of it stops where it is."""
        if slot.dead:
            return
        slot.dead = True
        self.crashes.append(f"{slot.name}({slot.worker_id}) {why}")
        me = asyncio.current_task()
        for actor in slot.actors:
            if actor.task is not None and not actor.task.done() and actor.task is not me:
                actor.task.cancel()
        for parked in list(self.parked):
            if parked.actor.slot is slot:
                parked.future.cancel()
        self.activity += 1

    def _poke(self) -> None:
        self.activity += 1
        if self.busy == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def quiesce(self) -> None:
        """Wait until no task can move without a release: every store call has returned
        and the loop has turned `SPIN` times with nothing happening."""
        quiet = 0
        while quiet < SPIN:
            if self.busy:
                self._idle = asyncio.get_running_loop().create_future()
                await self._idle
                quiet = 0
                continue
            before = self.activity
            await asyncio.sleep(0)
            quiet = quiet + 1 if self.activity == before and not self.busy else 0

    def running(self) -> list[Actor]:
        return [a for a in self.actors if a.status == "running"]


# An engine's incarnation, or a claim token minted from one.
TOKEN = re.compile(r"[0-9a-f]{12}|[0-9a-z]+\.[0-9a-f]{16}")


def describe(args: tuple[Any, ...]) -> str:
    """The arguments of a store call that say which rows it is about (ids and names),
    never times or objects: a label must read the same on every replay."""
    shown = []
    for a in args:
        if isinstance(a, bool):
            continue
        if isinstance(a, int):
            shown.append(str(a))
        elif isinstance(a, CleanupClaim):
            shown.append(f"cleanup of run {a.run_id}")
        elif isinstance(a, str) and TOKEN.fullmatch(a):
            shown.append("<token>")  # minted at random: the same on no two replays
        elif isinstance(a, str) and len(a) < 40:
            shown.append(a)
        elif isinstance(a, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in a):
            shown.append(str(a))
    return f"({', '.join(shown)})"


class GatedStore:
    """The store as one engine sees it: every coroutine method waits at a gate first."""

    def __init__(self, gates: Gates, slot_of: Callable[[], Slot], store: Store) -> None:
        self._gates = gates
        self._slot_of = slot_of
        self._store = store

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not inspect.iscoroutinefunction(value):
            return value
        gates = self._gates

        async def call(*args: Any, **kwargs: Any) -> Any:
            slot = self._slot_of()
            write = name if name in WRITES else None
            await gates.gate(f"{name}{describe(args)}", write)
            gates.busy += 1
            try:
                if slot.cut:
                    raise StoreError(f"{name}: the connection to the database was lost (cut off by the simulation)")
                result = await value(*args, **kwargs)
                if gates.observe is not None:
                    gates.observe(name, args, kwargs, result)
                return result
            except Crash:
                gates.kill(slot, f"at {slot.crashed_at}")
                raise
            finally:
                slot.armed = False
                if write:
                    gates.writes += 1
                gates.busy -= 1
                gates._poke()

        return call

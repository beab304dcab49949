"""One seed of the simulation: engines, a web process and a game server on one database,
driven by a seeded scheduler, with the invariants of DESIGN §10 checked after every step.

`run_seed(seed, databases)` answers a `SeedResult`: the trace of the scheduler's choices,
the violations found (each with the step it was seen at), and figures. The same seed on
the same backend makes the same choices, so a failing seed replays exactly.

What (e) calls exact. At the end the world must equal its start, with two exceptions,
both on purpose and both known to the simulation:

- A setting staff set by hand shows the last value set by hand that stands: Roadie left
  it alone (a restore, a layer popped, a borrow retried, a look at a borrow), or read it
  and gave it back as the value from before its borrow. An edit stands unless a restart
  took it away, or a call of Roadie's that had read the setting before the edit wrote
  after it: the lease protocol has no compare-and-set, and that window is the world's,
  so the world then owes what it owed before the edit (the same for what a restart put
  back). Every other write over a hand value breaks (j) at once.
- What staff forgot is theirs: an object whose row, or whose step's pending placeholder,
  was forgotten may stay, and a setting whose borrow or layer was forgotten is not
  judged (it shows what the forgotten borrow, or a restore already under way, left).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import func, select

from roadie.clock import FakeClock
from roadie.definitions import load_definition
from roadie.engine import Engine, EngineOptions, leases
from roadie.errors import InvalidState, Superseded
from roadie.modules.core import module as core_module
from roadie.registry import Registry
from roadie.states import LAYER_KIND, CleanupStatus, ResourceState, RunStatus, StepStatus
from roadie.store import CleanupClaim, NewResource, Store, dialects, tables
from roadie.store.rows import EventRow, RunRow
from tests.sim.databases import SeedDatabases
from tests.sim.scheduler import Actor, Crash, GatedStore, Gates, Parked, Slot, current
from tests.sim.world import INITIAL_SETTINGS, SimWorld, sim_module, step_of

WORLD_CALL = re.compile(r": (dispatch|borrow|restore|revert) ")  # a parked call that changes the world
EQUAL = "same"  # the tag a run is given now and then, so that two runs borrow equal values

CLAIM_TTL = 60.0
MAX_RUNS = 6
SPEEDS = (1.0, 1.0, 1.0, 1.0, 0.3, 0.03)
STEPS = 200  # random scheduler steps per seed, before the end lets every run settle
FINAL_LIMIT = 4000  # scheduler steps to let every run end and clean up after the random part
INVARIANTS = {
    "a-durable-first": "no world write without a durable row (a live row, or its step's pending placeholder)",
    "b-revert-once": "no resource reverted twice, no revert of something not made",
    "c-one-holder": "no two live rows for one target (a lease's core row and a module's override too)",
    "d-restore-own-value": "a lease restore never writes over a value another run set after",
    "e-world-restored": "after every run ended and cleaned up, the world equals its start "
    "(but for the last hand edit that stands, and what staff forgot)",
    "f-complete-is-clean": "a run whose cleanup is complete holds no live row",
    "g-attempt-counted": "every dispatch that reached the world counts as an attempt",
    "h-claim-fenced": "a worker whose step claim was taken over writes no ledger rows for it",
    "i-fence-order": "no world call lands after one under a newer claim for the same key or setting",
    "j-hand-left-alone": "no restore writes over a value set by hand, and no call writes over one it did not read",
    "k-forgotten-stays": "a row staff forgot stays abandoned: never restored, reverted or made live again",
}

EVENTS = {
    "raid": """
id: raid
title: Raid
params: {tag: {type: str, default: x}}
duration: 20s
cleanup: auto
phases:
  - name: omens
    steps:
      - {action: core.lease, name: dial, with: {lease: sim.dial, value: "{{ tag }}", for: 30s}, on_error: continue,
         timeout: 2m}
      - {action: core.lease, name: banner, with: {lease: sim.banner, value: "raid {{ tag }}", priority: 5, for: 25s}}
      - {action: sim.make, name: wave, with: {count: 2, late: 1}, retry: {attempts: 4, backoff: 1s}, timeout: 90s}
  - name: second
    after: 5s
    steps:
      - {action: core.lease, name: flag, with: {lease: sim.flag, target: north, value: "{{ tag }}"}, on_error: continue}
      - {action: sim.make, name: loot, with: {count: 1, lost: true}, retry: {attempts: 4, backoff: 1s}}
""",
    "siege": """
id: siege
title: Siege
params: {tag: {type: str, default: x}}
duration: 10s
cleanup: manual
phases:
  - name: walls
    steps:
      - {action: core.lease, name: south, with: {lease: sim.flag, target: south, value: "{{ tag }}", for: 20s}}
      - {action: sim.make, name: rams, with: {count: 2}, retry: {attempts: 3, backoff: 1s}, timeout: 3m}
      - {action: core.lease, name: north, with: {lease: sim.flag, target: north, value: "{{ tag }}"}, timeout: 5m}
      - {action: core.lease, name: banner, with: {lease: sim.banner, value: "siege {{ tag }}", priority: 9}}
  - name: aftermath
    after: 15s
    steps:
      - {action: core.lease, name: dial, with: {lease: sim.dial, value: "{{ tag }}", for: 20s}, on_error: continue}
""",
    "rogue": """
id: rogue
title: Rogue module
params: {tag: {type: str, default: x}}
duration: 10s
cleanup: auto
phases:
  - name: tamper
    steps:
      - {action: sim.override, name: tamper, with: {value: "{{ tag }}"}, retry: {attempts: 3, backoff: 1s}}
      - {action: sim.make, name: summoner, with: {count: 1, late: 2}, retry: {attempts: 3, backoff: 1s}}
""",
}


@dataclass
class Violation:
    invariant: str
    step: int  # the index in the trace of the choice after which it was seen
    what: str


@dataclass
class SeedResult:
    seed: int
    backend: str
    trace: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    steps: int = 0
    interleavings: int = 0  # releases chosen while two actors or more were parked
    crashes: int = 0
    runs: int = 0
    world_log: list[str] = field(default_factory=list)
    actor_errors: dict[str, int] = field(default_factory=dict)
    replay_options: str = ""

    def first(self, invariant: str) -> Violation | None:
        return next((v for v in self.violations if v.invariant == invariant), None)

    def describe(self, tail: int = 60) -> str:
        lines = [f"seed {self.seed} on {self.backend}: {len(self.violations)} violation(s)"]
        for v in self.violations:
            lines.append(f"  [{v.invariant}] after choice {v.step}: {v.what}")
        lines.append(f"  world (last {min(tail, len(self.world_log))} of {len(self.world_log)} changes):")
        lines.extend(f"    {c}" for c in self.world_log[-tail:])
        lines.append(f"  trace (last {min(tail, len(self.trace))} of {len(self.trace)} choices):")
        lines.extend(f"    {i}: {c}" for i, c in list(enumerate(self.trace))[-tail:])
        lines.append(
            f"  replay: python -m tests.sim --backend {self.backend} --seed {self.seed}{self.replay_options} --trace"
        )
        return "\n".join(lines)


Choice = tuple[float, str, Callable[[], Awaitable[None] | None]]


class Simulation:
    def __init__(
        self,
        seed: int,
        url: str,
        backend: str,
        steps: int,
        events: tuple[str, ...] = tuple(EVENTS),
        *,
        fences: bool = True,
    ) -> None:
        self.seed = seed
        self.event_names = events
        self.url = url
        self.rng = random.Random(seed)
        self.steps = steps
        self.clock = FakeClock()
        self.start = self.clock.now()
        self.gates = Gates(self.seconds)
        self.world = SimWorld(self.gates.gate, self.actor_name, self.seconds, refuse_stale=fences)
        self.world.in_transit = self.transit
        self.registry = Registry(self.clock)
        self.registry.register(core_module)
        self.registry.register(sim_module(self.world))
        self.result = SeedResult(seed, backend)
        self.slots: list[Slot] = []
        self.dead_stores: list[Store] = []
        self.events: dict[str, EventRow] = {}
        self.runs: list[RunRow] = []
        self.reporting: set[str] = set()  # late objects made and not yet reported
        self.seen: set[tuple[str, str]] = set()
        self.step = 0
        self.generation = 0
        self.last_look: tuple[int, int, int] | None = None
        self.last_runs: list[Any] = []
        self.recorded: list[tuple[int, int, str, int]] = []  # answers with rows, recorded since the last look
        self.cleanup_holder: dict[int, str] = {}  # run id -> the token its cleanup is claimed under
        self.live_ids: list[int] = []  # live ledger rows at the last look, for staff to forget
        self.forgotten: set[int] = set()  # rows staff forgot
        # What staff forgot is theirs to keep: objects (by ref, or by their step's key, for a
        # forgotten placeholder), and settings whose borrow or layer they forgot.
        self.kept_refs: set[str] = set()
        self.kept_keys: set[str] = set()
        self.kept_targets: set[str] = set()
        self.gates.observe = self.observe

    def seconds(self) -> float:
        return (self.clock.now() - self.start).total_seconds()

    def actor_name(self) -> str:
        actor = current.get()
        return actor.name if actor is not None else "scheduler"

    # -- engines ---------------------------------------------------------------------

    async def new_slot(self, name: str, worker_id: str) -> Slot:
        store = await Store.open(self.url, migrate_schema=False)
        holder: list[Slot] = []
        gated = GatedStore(self.gates, lambda: holder[0], store)
        options = EngineOptions(
            concurrency=4,
            claim_ttl=CLAIM_TTL,
            seed=self.seed * 1000 + len(self.slots),
            render_in_thread=False,
            record_pause=0.0,
        )
        engine = Engine(gated, self.registry, clock=self.clock, worker_id=worker_id, options=options)  # type: ignore[arg-type]
        slot = Slot(name, worker_id, store, gated, engine)
        holder.append(slot)

        def write_point(point: str) -> None:
            if slot.armed:
                slot.armed = False
                slot.crashed_at = point
                raise Crash(point)

        store.write_point = write_point
        return slot

    async def replace(self, slot: Slot) -> None:
        """A dead worker's process is started again: the same worker id, or a new one."""
        self.generation += 1
        worker_id = slot.worker_id if self.rng.random() < 0.5 else f"{slot.name}.g{self.generation}"
        fresh = await self.new_slot(slot.name, worker_id)
        self.slots[self.slots.index(slot)] = fresh
        self.dead_stores.append(slot.store)

    @property
    def web(self) -> Slot:
        return self.slots[-1]

    # -- the actors -------------------------------------------------------------------

    def spawn(self, base: str, kind: str, slot: Slot | None, work: Callable[[], Awaitable[Any]]) -> Actor:
        actor = self.gates.spawn(base, kind, slot, work)
        # Now and then an actor is slow (a worker in a long GC pause, a stalled connection):
        # the others overtake it, its claims expire, and it comes back as a zombie.
        actor.speed = self.rng.choice(SPEEDS)
        return actor

    def tick(self, slot: Slot) -> None:
        self.spawn(f"{slot.name}.tick", "tick", slot, slot.engine.tick)

    def heartbeat(self, slot: Slot) -> None:
        self.spawn(f"{slot.name}.beat", "beat", slot, slot.engine.heartbeat)

    def sweep(self, slot: Slot) -> None:
        async def work() -> None:
            await leases.sweep_expired(slot.gated, self.registry, self.clock, CLAIM_TTL)  # type: ignore[arg-type]

        self.spawn(f"{slot.name}.sweep", "sweep", slot, work)

    def keep(self, slot: Slot) -> None:
        """A worker's look at running runs' borrows, which puts back what a restarted world
        lost (the engine's tick does it every `keep_interval` too)."""

        async def work() -> None:
            await slot.engine.keeper.keep()

        self.spawn(f"{slot.name}.keep", "keep", slot, work)

    def cut(self, slot: Slot) -> None:
        """The worker loses its database, and keeps reaching the world (docs/deploy.md's
        layout: a game server beside it, the database across a network)."""
        slot.cut = True

    def reconnect(self, slot: Slot) -> None:
        slot.cut = False

    def transit(self, label: str, land: Callable[[], Any]) -> bool:
        """A world call given up at its gate by a worker cut off from the database (its claim
        ran out unrenewed, or its timeout): it was sent, and lands when the scheduler says."""
        actor = current.get()
        slot = actor.slot if actor is not None else None
        if slot is None or not slot.cut or slot.dead:
            return False

        async def work() -> None:
            await self.world.gate(f"land {label}")
            with contextlib.suppress(Superseded):  # refused, and counted, by the world
                land()

        # On the wire, behind whatever cut the database off: it arrives late, most often
        # after another worker has taken the step (or the row) over and acted.
        self.spawn("net.land", "transit", None, work).speed = self.rng.choice((0.03, 0.01, 0.001))
        return True

    def forget(self, row_id: int | None) -> None:
        """An admin forgets a live row (`roadie forget`, the dashboard's button)."""
        if row_id is None:
            row_id = self.rng.choice(self.live_ids)

        async def work() -> None:
            await self.web.engine.cleanup.forget(row_id, actor="admin", reason="the simulation forgets it")

        self.spawn("web.forget", "forget", self.web, work)

    def hand_edit(self, target: str) -> None:
        self.world.hand_edit(target, f"hand-{self.world.hand_edits + 1}")

    def click(self, slot: Slot, run_id: int, again: bool) -> None:
        async def work() -> None:
            await slot.engine.clean_up(run_id, actor="staff", again=again)

        self.spawn(f"{slot.name}.click", "click", slot, work)

    def cancel(self, run_id: int) -> None:
        async def work() -> None:
            await self.web.engine.cancel_run(run_id, actor="staff")

        self.spawn("web.cancel", "cancel", self.web, work)

    def start_run(self, event: str) -> None:
        # Now and then a run borrows the value another run borrows too: a restore that
        # checks whose value it writes over cannot tell the two apart, only the fence can.
        tag = EQUAL if self.rng.random() < 0.3 else f"r{len(self.runs) + 1}"

        async def work() -> None:
            # Forced past pre-flight: two raids meeting on one lease at dispatch is what the
            # simulation is for, and pre-flight is only a look, not a claim.
            run = await self.web.engine.start_run(self.events[event], {"tag": tag}, actor="staff", force=True)
            self.runs.append(run)

        self.runs.append(None)  # type: ignore[arg-type]  # a place held, so MAX_RUNS holds
        self.spawn("web.start", "start", self.web, work)

    def late(self, key: str, ref: str | None = None) -> None:
        """The game server reports what a step's effect made by itself, as the gateway
        takes it: refused once the run's cleanup has begun or ended (the module then
        removes the object itself)."""
        world, slot = self.world, self.web
        if ref is None:
            world.summons[key] -= 1

        async def work() -> None:
            nonlocal ref
            if ref is None:
                await world.gate(f"summon by {step_of(key)}")
                [obj] = world.make(key, 1, late=True)
                ref = obj.ref
                self.reporting.add(ref)
            run_id = world.made[ref].run_id
            steps = await slot.gated.list_steps(run_id)
            [step] = [s for s in steps if s.idempotency_key == key]
            run = await slot.gated.get_run(run_id)
            refused = run.cleanup_status not in (CleanupStatus.NOT_REQUIRED.value, CleanupStatus.PENDING.value)
            if not refused:
                payload = {"step": step_of(key), "late": True}
                try:
                    await slot.gated.record_late_resources(step, [NewResource("obj", ref, payload)], self.clock.now())
                except InvalidState:  # a cleanup took the run after the look above
                    refused = True
            if refused:
                # The game server removes its summon itself (unless cleanup's revert by
                # key found it first). That is not a revert by Roadie.
                await world.gate(f"unsummon {ref}")
                world.unsummon(ref)
            self.reporting.discard(ref)

        self.spawn("web.late", "late", slot, work)

    def shutdown(self, slot: Slot) -> None:
        """A worker stopped while it held steps (a stop that did not wait, or waited too
        little): its tasks are cancelled, and it deregisters, giving back what it holds."""
        slot.stopping = True
        for actor in slot.actors:
            if actor.task is not None and not actor.task.done():
                actor.task.cancel()
        for parked in list(self.gates.parked):
            if parked.actor.slot is slot:
                parked.future.cancel()

        async def work() -> None:
            await slot.gated.deregister_worker(slot.worker_id, slot.engine.incarnation, self.clock.now())
            slot.dead = True

        self.spawn(f"{slot.name}.deregister", "deregister", slot, work)

    # -- the invariants -----------------------------------------------------------------

    def violate(self, invariant: str, what: str) -> None:
        if (invariant, what) in self.seen:
            return
        self.seen.add((invariant, what))
        # Numbered by the trace: the last choice listed is the one after which it was seen.
        self.result.violations.append(Violation(invariant, len(self.result.trace) - 1, what))

    async def check(self, observer: Any) -> list[Any]:
        """(a), (b), (c), (d), (f) and (g), against the database as it is now. Answers the
        runs as they are, for the scheduler's next choice. Nothing is read again while nothing
        was written (in the database or in the world) since the last look."""
        changed = (self.gates.writes, len(self.world.log), len(self.world.problems))
        if changed == self.last_look:
            return self.last_runs
        self.last_look = changed
        r = tables.run_resources
        async with observer.connect() as conn:
            runs = list((await conn.execute(select(tables.runs).order_by(tables.runs.c.id))).all())
            live = (
                await conn.execute(
                    select(r.c.id, r.c.run_id, r.c.owner, r.c.kind, r.c.ref, r.c.state)
                    .where(r.c.state.in_(tables.LIVE_STATES))
                    .order_by(r.c.id)
                )
            ).all()
            forgotten = (
                []
                if not self.forgotten
                else (
                    await conn.execute(
                        select(r.c.id, r.c.state).where(
                            r.c.id.in_(sorted(self.forgotten)), r.c.state != ResourceState.ABANDONED.value
                        )
                    )
                ).all()
            )
            complete_dirty = (
                await conn.execute(
                    select(tables.runs.c.id, func.count())
                    .join(r, r.c.run_id == tables.runs.c.id)
                    .where(
                        tables.runs.c.cleanup_status == CleanupStatus.COMPLETE.value, r.c.state.in_(tables.LIVE_STATES)
                    )
                    .group_by(tables.runs.c.id)
                )
            ).all()
            recorded, self.recorded = self.recorded, []
            ids = [step_id for step_id, _, _, _ in recorded]
            now = (
                {}
                if not ids
                else {
                    row.id: row
                    for row in await conn.execute(
                        select(tables.steps.c.id, tables.steps.c.status, tables.steps.c.attempts).where(
                            tables.steps.c.id.in_(ids)
                        )
                    )
                }
            )
        for step_id, attempts, by, rows in recorded:
            step = now[step_id]
            if step.status != StepStatus.SUCCEEDED.value or step.attempts != attempts:
                self.violate(
                    "h-claim-fenced",
                    f"{by} recorded attempt {attempts} of step {step_id} ({rows} row(s), placeholder resolved) "
                    f"after its claim was taken over (the step is {step.status}, attempt {step.attempts})",
                )
        self.live_ids = [row.id for row in live]
        for row in forgotten:
            self.violate("k-forgotten-stays", f"row {row.id}, forgotten by staff, is {row.state}")
        live_refs = {row.ref for row in live if row.kind == "obj"}
        pending = {row.ref for row in live if row.kind == "@step" and row.state == "pending"}
        for obj in self.world.objects.values():
            if obj.ref in live_refs or obj.key in pending or obj.ref in self.reporting:
                continue
            if obj.ref in self.kept_refs or obj.key in self.kept_keys:
                continue
            self.violate(
                "a-durable-first", f"{obj.ref} made by {step_of(obj.key)} has no live row or pending placeholder"
            )
        overrides: dict[str, list[str]] = {}
        for row in live:
            if row.kind == "override":
                overrides.setdefault(row.ref, []).append(f"{row.owner} for run {row.run_id}")
        for ref, holders in overrides.items():
            if len(holders) > 1:
                self.violate("c-one-holder", f"{ref} has {len(holders)} live rows: {', '.join(sorted(holders))}")
        for run_id, count in complete_dirty:
            self.violate("f-complete-is-clean", f"run {run_id}'s cleanup is complete with {count} live row(s)")
        problems, self.world.problems = self.world.problems, []
        for invariant, what in problems:
            if invariant == "b?":
                self.judge_double_revert(what)
            elif invariant == "b?lease":
                self.judge_double_restore(what)
            else:
                self.violate(invariant, what)
        self.last_runs = runs
        return runs

    def observe(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """Follow who holds each run's cleanup, as the store's calls say, to tell a revert
        done again by a new owner after the old one lost its claim (harmless: it cannot
        know) from one done while two owners held the cleanup at once (DESIGN §10)."""
        actor = current.get()
        if actor is None:
            return
        claim = args[0] if args and isinstance(args[0], CleanupClaim) else None
        if name == "claim_cleanup" and result:
            assert claim is not None
            now = args[2]
            holders = {
                a.name
                for a in self.gates.running()
                if a is not actor and a.claims.get(claim.run_id) is not None and a.claims[claim.run_id] > now
            }
            if holders:
                actor.overlapped.setdefault(claim.run_id, set()).update(holders)
            actor.claims[claim.run_id] = now + timedelta(seconds=claim.ttl)
            self.cleanup_holder[claim.run_id] = claim.token
        elif name == "finish_cleanup" and claim is not None:
            actor.claims.pop(claim.run_id, None)
            self.cleanup_holder.pop(claim.run_id, None)
        elif claim is not None and self.cleanup_holder.get(claim.run_id) == claim.token:
            # Every write a cleanup makes under its claim pushes the claim's expiry on, to
            # `ttl` from the time the call was given (the store's `now`), not from when
            # it returned: the clock may have moved while it waited at its gate.
            given = next((a for a in (*args, *kwargs.values()) if isinstance(a, datetime)), self.clock.now())
            actor.claims[claim.run_id] = given + timedelta(seconds=claim.ttl)
        elif name in ("record_outcomes", "record_and_claim"):
            for o in args[0]:
                if o.status is StepStatus.SUCCEEDED and (o.resources or o.resolve_placeholder) and not o.stale:
                    self.recorded.append((o.step.id, o.step.attempts, actor.name, len(o.resources)))
        elif name == "abandon_resource":
            self.forgotten.add(int(args[0]))
            if result.kind == "obj":
                self.kept_refs.add(result.ref)
            elif result.kind == "@step":
                self.kept_keys.add(result.ref)
            else:  # a borrow's row, or a layer's
                target = str(result.payload["lease"]) if result.kind == LAYER_KIND else result.ref
                self.kept_targets.add(target)
                self.world.forgotten.add((target, result.run_id))
        elif name == "claim_expired_lease" and result:
            actor.leases[int(args[0])] = args[2] + timedelta(seconds=float(args[3]))
        elif name == "release_lease_row":
            actor.leases.pop(int(args[0]), None)  # given back: another sweeper may take it now
        elif name == "deregister_worker":
            incarnation = str(args[1])
            for run_id in [r for r, token in self.cleanup_holder.items() if token.startswith(incarnation)]:
                del self.cleanup_holder[run_id]

    def judge_double_restore(self, seen: str) -> None:
        """A lease row given back twice. Harmless when the first restorer died, or its claim
        (the sweeper's on the row, a cleanup's on the run) had run out: a violation when it
        still held one, since the second then acted on a row another owner held."""
        key, again_by = seen.split(" ")
        first = next(a for a in self.gates.actors if a.name == self.world.restored[key])
        if first.died or first is next((a for a in self.gates.actors if a.name == again_by), None):
            return
        run_id, row_id = (int(x) for x in key.removeprefix("restore-").split("-"))
        now = self.clock.now()
        swept = first.leases.get(row_id)
        held = (swept is not None and swept > now) or (first.claims.get(run_id) or now) > now
        if held:
            self.violate(
                "b-revert-once",
                f"lease row {row_id} of run {run_id} restored by {again_by} after {first.name}, which still held it",
            )

    def judge_double_revert(self, seen: str) -> None:
        """An object reverted again. Harmless when whoever reverted it first died before it
        could say so, or had lost its claim when the second took the cleanup: the new owner
        cannot know. A violation when the second took the cleanup while the first held it."""
        ref, again_by = seen.split(" ")
        first = self.world.removed[ref]
        actor = next(a for a in self.gates.actors if a.name == first.actor)
        second = next((a for a in self.gates.actors if a.name == again_by), None)
        run_id = self.world.made[ref].run_id
        if actor.died or second is None or first.actor not in second.overlapped.get(run_id, set()):
            return
        self.violate(
            "b-revert-once",
            f"{ref} reverted by {again_by} after {first.actor} reverted it, both holding run {run_id}'s cleanup",
        )

    # -- the scheduler ------------------------------------------------------------------

    def choices(self, runs: list[Any]) -> list[Choice]:
        rng = self.rng
        out: list[Choice] = []
        parked = sorted(self.gates.parked, key=lambda p: p.label)
        # A lease about to be given back waits longer than the rest, and a new run that
        # borrows it may start meanwhile: is the old value ever restored over the new one?
        restoring = [p for p in parked if ": restore sim." in p.label]
        # A worker cut off from the database is slow to hear from the world too (the same
        # network trouble): its calls are still out when its claims run out unrenewed.
        sent = {p.label for p in parked if p.actor.slot is not None and WORLD_CALL.search(p.label)}
        straggling = {p.label for p in parked if p.label in sent and p.actor.slot is not None and p.actor.slot.cut}
        speeds = {
            p.label: p.actor.speed * (0.2 if p in restoring else 1.0) * (0.05 if p.label in straggling else 1.0)
            for p in parked
        }
        total = sum(speeds.values())
        for p in parked:
            out.append((60 * speeds[p.label] / total, f"release {p.label}", self.releaser(p)))
            if p.write and p.actor.slot is not None and not p.actor.slot.dead:
                out.append((2.5 / len(parked), f"crash at {p.label}", self.releaser(p, crash=True)))
        for p in parked:
            # A staff click on a run whose cleanup this very worker is doing (the dashboard
            # and the worker may share a worker id), or that another worker is doing.
            slot = p.actor.slot
            if p.actor.kind == "tick" and p.actor.claims and slot is not None and not slot.dead:
                run_id = max(p.actor.claims, key=lambda i: p.actor.claims[i])
                out.append((2, f"click {slot.name} run {run_id}", lambda s=slot, i=run_id: self.click(s, i, False)))
                out.append((1, f"click web run {run_id}", lambda i=run_id: self.click(self.web, i, False)))
        for slot in self.slots:
            if slot.dead or slot.stopping:
                continue
            if slot is not self.web and not slot.running("tick"):
                out.append((6, f"tick {slot.name}", lambda s=slot: self.tick(s)))
            if slot is not self.web and not slot.running("beat"):
                out.append((1, f"heartbeat {slot.name}", lambda s=slot: self.heartbeat(s)))
            if not slot.running("sweep"):
                out.append((0.7, f"sweep {slot.name}", lambda s=slot: self.sweep(s)))
            out.append((0.25, f"kill {slot.name}", lambda s=slot: self.gates.kill(s, "between writes")))
            if slot is not self.web:
                out.append((0.4, f"shutdown {slot.name}", lambda s=slot: self.shutdown(s)))
                if not slot.running("keep"):
                    out.append((0.3, f"keep {slot.name}", lambda s=slot: self.keep(s)))
                if slot.cut:
                    out.append((1.5, f"reconnect {slot.name}", lambda s=slot: self.reconnect(s)))
                else:
                    # Most often while it has a call out to the world.
                    calling = any(p.actor.slot is slot and p.label in sent for p in parked)
                    label = f"cut {slot.name} off the database{' mid-call' if calling else ''}"
                    out.append((2.0 if calling else 0.2, label, lambda s=slot: self.cut(s)))
        # Staff forget a row: any live one, or one a sweeper or a cleanup is giving back.
        if self.live_ids:
            out.append((0.3, "forget a live row", lambda: self.forget(None)))
        for p in restoring:
            row_id = int(p.label.rsplit("-", 1)[1])
            out.append((1.0, f"forget row {row_id}", lambda i=row_id: self.forget(i)))
        # Staff set a setting by hand, most often one that a borrow or a layer is in force on.
        for target in sorted(INITIAL_SETTINGS):
            writer = self.world.writers.get(target)
            weight = 0.25 if writer is not None and writer.how == "borrow" else 0.05
            out.append((weight, f"hand edit {target}", lambda t=target: self.hand_edit(t)))
        # The world saves, or is killed before it saves and comes back as it last saved.
        if self.world.changes != self.world.saved_at:
            out.append((0.5, "world saves", self.world.save))
            out.append((0.3, "world restarts", self.world.restart))
        if restoring and len(self.runs) < MAX_RUNS + 2 and "raid" in self.event_names:
            out.append((4, "start raid", lambda: self.start_run("raid")))
        if len(self.runs) < MAX_RUNS:
            for name in self.event_names:
                out.append((1.5, f"start {name}", lambda n=name: self.start_run(n)))
        for run in runs:
            if RunStatus(run.status).terminal:
                slot = self.slots[rng.randrange(len(self.slots))]
                if not (slot.dead or slot.stopping):
                    again = run.cleanup_status != CleanupStatus.PENDING.value or rng.random() < 0.3
                    label = f"click {slot.name} run {run.id}{' again' if again else ''}"
                    out.append((2.5, label, lambda s=slot, i=run.id, a=again: self.click(s, i, a)))
            elif not run.cancel_requested:
                out.append((0.6, f"cancel run {run.id}", lambda i=run.id: self.cancel(i)))
        for key in sorted((k for k, n in self.world.summons.items() if n > 0), key=step_of):
            out.append((3, f"late {step_of(key)}", lambda k=key: self.late(k)))
        for label, seconds in (("+5s", 5.0), ("+31s", 31.0), ("+61s", CLAIM_TTL + 1), ("+301s", CLAIM_TTL * 5 + 1)):
            weight = {"+5s": 3.0, "+31s": 1.0, "+61s": 2.0, "+301s": 0.5}[label]
            out.append((weight, f"clock {label}", lambda s=seconds: self.clock.advance(s)))
        return out

    def releaser(self, parked: Parked, *, crash: bool = False) -> Callable[[], None]:
        def release() -> None:
            if len(self.gates.parked) > 1:
                self.result.interleavings += 1
            self.gates.release(parked, crash=crash)

        return release

    async def act(self, label: str, action: Callable[[], Awaitable[None] | None]) -> None:
        self.result.trace.append(label)
        done = action()
        if done is not None:
            await done

    async def settle_step(self, runs: list[Any]) -> bool:
        """One step of the end: no more crashes, runs or cancels; release, report, tick,
        let time pass and click "clean up again" until every run has cleaned up.
        Answers True once everything is settled."""
        parked = sorted(self.gates.parked, key=lambda p: p.label)
        if parked:
            p = parked[self.rng.randrange(len(parked))]
            await self.act(f"release {p.label}", self.releaser(p))
            return False
        if self.gates.running():
            # Nobody is at a gate, and some are still running: they wait on the clock
            # (a change waiting for a lease's stack), and time must pass for them.
            deadline = self.clock.next_deadline()
            if deadline is not None:
                await self.act("clock to the next sleeper", lambda: self.clock.set(deadline))
            return False
        for slot in self.slots:
            if slot.cut:
                await self.act(f"reconnect {slot.name}", lambda s=slot: self.reconnect(s))
                return False
        for key in sorted((k for k, n in self.world.summons.items() if n > 0), key=step_of):
            await self.act(f"late {step_of(key)}", lambda k=key: self.late(k))
            return False
        for slot in self.slots:
            if slot.dead:
                await self.act(f"restart {slot.name}", lambda s=slot: self.replace(s))
                return False
        # (After the restarts: a report made through a dead web process goes nowhere.)
        for ref in sorted(self.reporting):
            obj = self.world.made[ref]
            await self.act(f"report again {ref}", lambda o=obj: self.late(o.key, o.ref))
            return False
        unsettled = [r for r in runs if not _settled(r)]
        if not unsettled:
            return True
        self.idle_rounds += 1
        if self.idle_rounds % 3 == 0:
            await self.act("clock +61s", lambda: self.clock.advance(CLAIM_TTL + 1))
        elif self.idle_rounds % 3 == 1:
            for slot in self.slots[:-1]:
                await self.act(f"tick {slot.name}", lambda s=slot: self.tick(s))
        else:
            for run in unsettled:
                if RunStatus(run.status).terminal and not self.web.running("click"):
                    again = run.cleanup_status != CleanupStatus.PENDING.value
                    label = f"click web run {run.id}{' again' if again else ''}"
                    await self.act(label, lambda i=run.id, a=again: self.click(self.web, i, a))
        return False

    async def run(self, databases: SeedDatabases) -> SeedResult:
        observer = dialects.create_engine(self.url)
        try:
            setup = await Store.open(self.url, migrate_schema=False)
            for name, text in EVENTS.items():
                d = load_definition(text, f"{name}.yaml", self.registry)
                self.events[name] = await setup.create_event_version(
                    d.id, d.title, d.model_dump(mode="json", by_alias=True), text, "sim", self.clock.now()
                )
            await setup.close()
            for i in range(2 + self.rng.randrange(3)):
                self.slots.append(await self.new_slot(f"w{i}", f"w{i}"))
            self.slots.append(await self.new_slot("web", "web"))
            self.start_run("raid")
            await self.random_part(observer)
            await self.final_part(observer)
        finally:
            for actor in self.gates.running():
                if actor.task is not None:
                    actor.task.cancel()
            await self.gates.quiesce()
            await observer.dispose()
            for store in [*self.dead_stores, *(s.store for s in self.slots)]:
                await store.close()
        self.result.crashes = len(self.gates.crashes)
        self.result.runs = len([r for r in self.runs if r is not None])
        self.result.world_log = self.world.log
        for actor in self.gates.actors:
            if actor.error:
                self.result.actor_errors[actor.error] = self.result.actor_errors.get(actor.error, 0) + 1
        return self.result

    async def random_part(self, observer: Any) -> None:
        for step in range(self.steps):
            self.step = step
            await self.gates.quiesce()
            runs = await self.check(observer)
            for slot in list(self.slots):
                if slot.dead and not any(a.status == "running" for a in slot.actors):
                    await self.act(f"restart {slot.name}", lambda s=slot: self.replace(s))
            options = self.choices(runs)
            weights = [w for w, _, _ in options]
            [(_, label, action)] = self.rng.choices(options, weights)
            await self.act(label, action)
        self.result.steps = self.steps

    async def final_part(self, observer: Any) -> None:
        self.idle_rounds = 0
        for step in range(self.steps, self.steps + FINAL_LIMIT):
            self.step = step
            await self.gates.quiesce()
            if await self.settle_step(await self.check(observer)):
                break
        else:
            self.violate("e-world-restored", f"the runs did not settle within {FINAL_LIMIT} steps")
        self.result.steps = self.step
        await self.gates.quiesce()
        await self.check(observer)
        async with observer.connect() as conn:
            r = tables.run_resources
            left = (
                await conn.execute(select(r.c.run_id, r.c.kind, r.c.ref).where(r.c.state.in_(tables.LIVE_STATES)))
            ).all()
        # What staff forgot is theirs: an object whose row (or whose step's placeholder) was
        # forgotten may stay, and a setting whose borrow or layer was forgotten shows what
        # it will. Everything else is as it was, but where a hand edit stands.
        for obj in sorted(self.world.objects.values(), key=lambda o: o.ref):
            if obj.ref not in self.kept_refs and obj.key not in self.kept_keys:
                self.violate("e-world-restored", f"{obj.ref} made by {step_of(obj.key)} is still in the world")
        for target, value in sorted(self.world.settings.items()):
            owed = self.world.expected(target)
            if value != owed and target not in self.kept_targets:
                was = "set by hand" if owed != INITIAL_SETTINGS[target] else "was"
                self.violate("e-world-restored", f"{target} is {value!r}, {was} {owed!r}")
        for row in left:
            self.violate("e-world-restored", f"run {row.run_id} still holds a live row {row.kind} {row.ref}")


def _settled(run: Any) -> bool:
    if not RunStatus(run.status).terminal:
        return False
    return run.cleanup_status in (CleanupStatus.COMPLETE.value, CleanupStatus.NOT_REQUIRED.value)


def run_seed(
    seed: int,
    databases: SeedDatabases,
    steps: int = STEPS,
    events: tuple[str, ...] = tuple(EVENTS),
    *,
    fences: bool = True,
) -> SeedResult:
    """Run one seed on a fresh database and answer what happened. `events` limits the
    events the scheduler may start (a replay must name the same ones); `fences` off makes
    the world take calls under stale fences, to show what fences hold back."""

    async def main() -> SeedResult:
        asyncio.get_running_loop().set_exception_handler(_quiet_crashes)
        url = await databases.fresh()
        result = await Simulation(seed, url, databases.backend, steps, events, fences=fences).run(databases)
        if events != tuple(EVENTS):
            result.replay_options = f" --events {','.join(events)}"
        if not fences:
            result.replay_options += " --no-fences"
        return result

    return asyncio.run(main())


def _quiet_crashes(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A task an engine started beside its tick (a look at borrows, a sweep) that died in a
    crash is not a failure of the simulation: its process died."""
    if isinstance(context.get("exception"), Crash):
        return
    loop.default_exception_handler(context)


def quiet_logging() -> None:
    """The engine logs every retry and failed revert; a simulation makes thousands."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))

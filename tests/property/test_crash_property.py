"""A crash anywhere, lost answers and failures never break the ledger's promises (DESIGN §10).

Random events run over the sandbox world with random faults: module failures, lost
answers, half-applied world crashes, failing reverts, and a crash of the engine process
between any two database writes. A crash is simulated at the store's named write point:
the transaction that meets it is aborted, the dead store refuses every later write, the
engine object is abandoned, and a fresh store, registry and engine (another worker id)
are started on the same files and the same clock. Once the run has ended and its cleanup
is complete (a human's "clean up again" included, when revert faults made it
`incomplete`), the world must equal its state before the run, no object may have been
removed twice or made twice, no target may have two live rows, and every ledger row of
the run must be final.

`ROADIE_PROPERTY_EXAMPLES` sets how many random examples run (default 30, about
10 s on a small machine; `make chaos`: 500); set it to a few thousand for a soak.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from tests.databases import Database

from roadie.clock import FakeClock
from roadie.definitions import EventDefinition
from roadie.engine import Engine, EngineOptions
from roadie.modules.sandbox import SandboxWorld
from roadie.modules.sandbox.world import SEED_REGIONS
from roadie.registry import Registry, build_registry
from roadie.states import CleanupStatus, RunStatus
from roadie.store import Store, tables
from roadie.store.rows import EventRow, RunRow

CLAIM_TTL = 60.0
# The engine holds a cleanup for five claim TTLs; past that a dead worker's cleanup is
# anyone's, so a restart moves the clock beyond it.
DEAD_WORKER_EXPIRY = CLAIM_TTL * 5 + 1
MAX_TICKS = 3000
FINAL_STATES = {"resolved", "reverted", "abandoned"}
EXAMPLES = int(os.environ.get("ROADIE_PROPERTY_EXAMPLES", "30"))

settings.register_profile(
    "roadie-crash",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


# -- crashing the process at a write point --------------------------------------------------


def _crashes_are_seen(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A task of the dead engine that the crash ended by itself (an automatic cleanup, which
    nobody awaits once its engine is gone) has the crash as its exception: that is the
    death the test made, not an error lost. Anything else goes to the default handler."""
    if isinstance(context.get("exception"), SimulatedCrash):
        return
    loop.default_exception_handler(context)


class SimulatedCrash(BaseException):
    """The engine's process died. A BaseException, like the signal that kills a process:
    no `except Exception` in the engine may swallow it and carry on writing."""


class CrashPlan:
    """A store's write point that kills the process at one write transaction: the `at`-th
    of all, or the `occurrence`-th one named `name`. After that every write is refused,
    because a dead process commits nothing more."""

    def __init__(self, at: int | None = None, *, name: str | None = None, occurrence: int = 1) -> None:
        self.at = at
        self.name = name
        self.occurrence = occurrence
        self.writes: list[str] = []
        self.crashed_at: str | None = None

    def __call__(self, point: str) -> None:
        if self.crashed_at is not None:
            raise SimulatedCrash(f"the process died at {self.crashed_at}; {point} never commits")
        self.writes.append(point)
        if self.name is not None:
            due = point == self.name and self.writes.count(point) == self.occurrence
        else:
            due = self.at is not None and len(self.writes) == self.at
        if due:
            self.crashed_at = f"write {len(self.writes)} ({point})"
            raise SimulatedCrash(f"crash at {self.crashed_at}")


def _is_roadie_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and f"{os.sep}roadie{os.sep}" in code.co_filename


class Harness:
    """One test's files and clock, and the worker process currently living on them.

    Every write of the store passes `write_point`: the crash plan of the living worker
    is met there, and so is an operator's cancel, which arrives (as a request from
    elsewhere would) while the worker is in the middle of its work.
    """

    def __init__(self, directory: str, database_url: str) -> None:
        self.clock = FakeClock()
        self.world_path = os.path.join(directory, "world.db")
        self.database_url = database_url
        self.generation = 0
        self.crashes: list[str] = []
        self.plan: CrashPlan | None = None
        self.writes = 0
        self.cancel_at: int | None = None  # the write during which an operator cancels...
        self.cancel_run: int | None = None  # ...this run
        self.cancelling: asyncio.Task[bool] | None = None
        self.registry: Registry
        self.store: Store
        self.engine: Engine

    async def boot(self) -> None:
        """Start a worker process: a fresh registry (the world reopened on its file), store
        and engine, with a worker id of its own."""
        asyncio.get_running_loop().set_exception_handler(_crashes_are_seen)
        self.registry = build_registry({"sandbox": {"db": self.world_path}}, clock=self.clock)
        self.store = await Store.open(self.database_url)
        self.store.write_point = self.write_point
        self.engine = Engine(
            self.store,
            self.registry,
            clock=self.clock,
            worker_id=f"worker-{self.generation}",
            options=EngineOptions(claim_ttl=CLAIM_TTL, seed=self.generation),
        )

    def write_point(self, point: str) -> None:
        self.writes += 1
        if self.plan is not None and self.plan.crashed_at is None and self.cancel_due():
            assert self.cancel_run is not None
            engine = self.engine
            self.cancelling = asyncio.get_running_loop().create_task(
                engine.cancel_run(self.cancel_run, actor="operator")
            )
        if self.plan is not None:
            self.plan(point)

    def cancel_due(self) -> bool:
        return self.cancel_at is not None and self.cancelling is None and self.writes >= self.cancel_at

    async def cancelled(self) -> None:
        """The operator's cancel, if it was asked for, has been answered (or is asked now)."""
        if self.cancel_at is None:
            return
        if self.cancelling is None:
            assert self.cancel_run is not None
            await self.engine.cancel_run(self.cancel_run, actor="operator")
        else:
            await self.cancelling
        self.cancel_at = None

    @property
    def world(self) -> SandboxWorld:
        world = self.registry.state("sandbox")
        assert isinstance(world, SandboxWorld)
        return world

    async def crash(self) -> None:
        """The process is dead: nothing it still runs may commit, its tasks stop, and the
        next worker finds the dead one's claims expired."""
        assert self.plan is not None
        assert self.plan.crashed_at is not None, "a SimulatedCrash escaped without its plan firing"
        self.crashes.append(self.plan.crashed_at)
        self.store.write_point = self.plan  # fired: the dead store refuses every write, whatever comes next
        # Stop what the dead engine still runs: roadie's own tasks only. A connection
        # the driver is closing because its task was cancelled is left alone; cancelling
        # that close as well can leave it waiting forever on a stopped driver thread.
        ours = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and _is_roadie_task(t)]
        for task in ours:
            task.cancel()
        if ours:
            await asyncio.wait(ours, timeout=30)
        if self.cancelling is not None and (self.cancelling.cancelled() or self.cancelling.exception()):
            self.cancelling = None  # the operator's request died with the worker: asked again
        await assert_one_live_row_per_target(self.store)
        await self.store.close()
        await self.registry.close()
        self.generation += 1
        self.clock.advance(DEAD_WORKER_EXPIRY)
        await self.boot()

    async def close(self) -> None:
        await self.store.close()
        await self.registry.close()


async def drive(h: Harness, run_ids: list[int]) -> list[RunRow]:
    """Carry the runs to their end and their cleanup to `complete`, as the worker and the
    humans around it would: an operator may cancel a run on the way, a `manual` cleanup
    is started by an operator, and an `incomplete` one is retried by a human once the
    fault is fixed."""
    ended = await h.engine.settle(run_ids, max_ticks=MAX_TICKS)
    await h.cancelled()
    for run in ended:
        if run.cleanup_status == CleanupStatus.PENDING:
            assert run.cleanup_policy == "manual", f"settle returned with an automatic cleanup pending: {run}"
            await h.engine.clean_up(run.id, actor="operator")
    for run_id in run_ids:
        if (await h.store.get_run(run_id)).cleanup_status == CleanupStatus.INCOMPLETE:
            h.world.clear_faults()
            await h.engine.clean_up(run_id, actor="operator", again=True)
    return [await h.store.get_run(i) for i in run_ids]


async def survive(h: Harness, run_ids: list[int], plans: list[CrashPlan]) -> list[RunRow]:
    """`drive` the runs, crashing at each plan in turn (a plan never reached is no crash),
    restarting the worker after each crash, and finishing with a worker that lives."""
    pending = list(plans)
    while True:
        h.plan = pending.pop(0) if pending else CrashPlan()
        try:
            return await drive(h, run_ids)
        except SimulatedCrash:
            await h.crash()


# -- the properties ---------------------------------------------------------------------------


async def assert_one_live_row_per_target(store: Store) -> None:
    """The database's committed state: no (owner, kind, ref) held by two pending/live rows."""
    r = tables.run_resources.c
    query = (
        select(r.owner, r.kind, r.ref, func.count())
        .where(r.state.in_(["pending", "live"]))
        .group_by(r.owner, r.kind, r.ref)
        .having(func.count() > 1)
    )
    async with store.engine.connect() as conn:
        doubles = [tuple(row) for row in await conn.execute(query)]
    assert doubles == [], f"two live rows for one target: {doubles}"


async def assert_invariants(h: Harness, run_ids: list[int], before: dict[str, Any]) -> None:
    # Buffs undo themselves by the clock: let every one of them run out first.
    h.clock.advance(86_400)
    after = h.world.snapshot()
    assert after == before, f"the world is not what it was before the runs (crashes: {h.crashes})"

    effects = h.world.effects()
    removed = Counter((e["kind"], e["ref"]) for e in effects if e["op"] == "remove")
    assert [t for t, n in removed.items() if n > 1] == [], "an object was reverted twice"
    objects = [e for e in effects if e["op"] == "create" and e["kind"] in ("creature", "item")]
    made = Counter((e["key"], e["kind"], e["idx"]) for e in objects)
    assert [t for t, n in made.items() if n > 1] == [], "one (key, idx) object was made twice"
    serials = Counter((e["kind"], e["ref"]) for e in objects)
    assert [t for t, n in serials.items() if n > 1] == [], "one serial was made twice"

    await assert_one_live_row_per_target(h.store)
    for run_id in run_ids:
        rows = await h.store.list_resources(run_id)
        run = await h.store.get_run(run_id)
        unfinished = [(r.id, r.kind, r.ref, r.state, r.error) for r in rows if r.state not in FINAL_STATES]
        assert unfinished == [], f"run {run_id}: ledger rows left live after cleanup: {unfinished}"
        assert RunStatus(run.status).terminal, f"run {run_id} is {run.status}"
        if rows:
            assert run.cleanup_status == CleanupStatus.COMPLETE.value, (
                f"run {run_id}: cleanup {run.cleanup_status} (crashes: {h.crashes})"
            )
        else:
            assert run.cleanup_status in (CleanupStatus.NOT_REQUIRED.value, CleanupStatus.COMPLETE.value)


# -- scenarios ----------------------------------------------------------------------------------


@dataclass
class Faults:
    """Counted knobs armed on the world before the run (they live in its file, so they
    outlast a crash of the engine)."""

    actions: list[tuple[str, str | None, int]] = field(default_factory=list)  # (fail|lose|crash, op, n)
    failing_reverts: int = 0

    def arm(self, world: SandboxWorld) -> None:
        knobs: dict[str, Callable[..., None]] = {
            "fail": world.fail_next,
            "lose": world.lose_next,
            "crash": world.crash_next,
        }
        for kind, op, n in self.actions:
            knobs[kind](n, action=op)
        world.fail_reverts_next(self.failing_reverts)


async def start(
    h: Harness, definition: dict[str, Any], faults: Faults, runs: int = 1
) -> tuple[list[RunRow], dict[str, Any]]:
    """Create the event and `runs` runs of it; answer them and the world as it was before."""
    model = EventDefinition.model_validate(definition)
    stored: EventRow = await h.store.create_event_version(
        model.id, model.title, model.model_dump(mode="json", by_alias=True), "", "test", h.clock.now()
    )
    before = h.world.snapshot()
    faults.arm(h.world)
    started = [await h.engine.start_run(stored, {}) for _ in range(runs)]
    return started, before


def scenario(database: Database, body: Callable[[Harness], Awaitable[None]]) -> None:
    """Run `body` on a fresh database and world file of its own (hypothesis reuses
    fixtures across examples, so each example makes and drops its own)."""
    with tempfile.TemporaryDirectory() as directory:
        url = database.fresh(Path(directory))

        async def main() -> None:
            h = Harness(directory, url)
            await h.boot()
            try:
                await body(h)
            finally:
                await h.close()

        try:
            asyncio.run(main())
        finally:
            database.drop_all()


regions = st.sampled_from(SEED_REGIONS)
spawn = st.fixed_dictionaries(
    {
        "action": st.just("sandbox.spawn"),
        "with": st.fixed_dictionaries(
            {"kind": st.sampled_from(["orc", "troll"]), "region": regions, "count": st.integers(1, 5)}
        ),
    }
)
place_item = st.fixed_dictionaries(
    {
        "action": st.just("sandbox.place_item"),
        "with": st.fixed_dictionaries(
            {"kind": st.sampled_from(["chest", "gold pile"]), "region": regions, "count": st.integers(1, 5)}
        ),
    }
)
broadcast = st.fixed_dictionaries(
    {
        "action": st.just("sandbox.broadcast"),
        "with": st.fixed_dictionaries({"message": st.just("hear ye")}, optional={"region": regions}),
    }
)
buff = st.fixed_dictionaries(
    {
        "action": st.just("sandbox.buff"),
        "with": st.fixed_dictionaries(
            {"name": st.sampled_from(["blessing", "haste"]), "region": regions, "duration": st.integers(1, 30)}
        ),
    }
)
holds = {"for": st.sampled_from(["2s", "30s"])}
weather = st.fixed_dictionaries(
    {
        "action": st.just("core.lease"),
        "with": st.fixed_dictionaries(
            {
                "lease": st.just("sandbox.weather"),
                "target": regions,
                "value": st.sampled_from(["storm", "fog", "snow"]),
            },
            optional=holds,
        ),
    }
)
xp_rate = st.fixed_dictionaries(
    {
        "action": st.just("core.lease"),
        "with": st.fixed_dictionaries(
            {"lease": st.just("sandbox.xp_rate"), "value": st.sampled_from([0.5, 2.0, 3.0])}, optional=holds
        ),
    }
)
steps = st.tuples(
    st.one_of(spawn, place_item, broadcast, buff, weather, xp_rate),
    st.integers(1, 4),
    st.sampled_from(["fail", "continue"]),
).map(lambda t: {**t[0], "retry": {"attempts": t[1], "backoff": "200ms"}, "on_error": t[2]})
phases = st.lists(
    st.fixed_dictionaries({"steps": st.lists(steps, min_size=1, max_size=4)}, optional={"after": st.integers(1, 10)}),
    min_size=1,
    max_size=4,
).map(lambda ps: [{"name": f"phase {i}", **p} for i, p in enumerate(ps)])
events = st.fixed_dictionaries(
    {
        "id": st.just("prop"),
        "duration": st.sampled_from([0, 5, 20]),
        "cleanup": st.sampled_from(["auto", "auto", "manual"]),
        "phases": phases,
    }
)
ops = st.sampled_from([None, "spawn", "place_item", "broadcast", "buff", "weather", "xp_rate"])
fault_plans = st.builds(
    Faults,
    actions=st.lists(st.tuples(st.sampled_from(["fail", "lose", "crash"]), ops, st.integers(1, 3)), max_size=4),
    failing_reverts=st.integers(0, 3),
)
# Where a worker process dies: at its N-th write transaction, or at the k-th write of a
# given name (so the rarer write points are met as often as the every-tick ones). A
# second plan kills the worker that replaced the first.
WRITE_POINTS = [
    "claim_steps",
    "record_outcomes",
    "save_lease_value",
    "materialise_phase",
    "advance_runs",
    "requeue_expired_claims",
    "heartbeat_worker",
    "claim_expired_lease",
    "mark_lease_restored",
    "release_lease_row",
    "claim_lease_row",
    "request_cancel",
    "fail_run",
    "claim_cleanup",
    "mark_reverted",
    "extend_cleanup_claim",
    "finish_cleanup",
]
crash_plans = st.lists(
    st.one_of(st.integers(1, 40), st.tuples(st.sampled_from(WRITE_POINTS), st.integers(1, 3))),
    min_size=1,
    max_size=2,
)
# An operator's cancel of the first run, arriving during this write of the store.
cancels = st.one_of(st.none(), st.integers(1, 30))


def _plan(spec: int | tuple[str, int]) -> CrashPlan:
    if isinstance(spec, int):
        return CrashPlan(spec)
    return CrashPlan(name=spec[0], occurrence=spec[1])


@pytest.mark.timeout(max(120, EXAMPLES * 2))  # about 0.3 s an example; a soak needs room
@settings(settings.get_profile("roadie-crash"))
@given(
    definition=events,
    faults=fault_plans,
    crashes=crash_plans,
    runs=st.sampled_from([1, 1, 2]),
    cancel=cancels,
)
def test_crashes_and_faults_never_break_cleanup(
    database: Database,
    definition: dict[str, Any],
    faults: Faults,
    crashes: list[int | tuple[str, int]],
    runs: int,
    cancel: int | None,
) -> None:
    """Whatever the event, the faults and where the process dies, cleanup ends with the
    world as it was, nothing reverted twice and no target held twice. Two runs of one
    event at once contend for the same lease targets; one may be cancelled midway."""

    async def body(h: Harness) -> None:
        started, before = await start(h, definition, faults, runs)
        ids = [r.id for r in started]
        h.cancel_at, h.cancel_run = cancel, ids[0]
        final = await survive(h, ids, [_plan(c) for c in crashes])
        event(f"crashes: {len(h.crashes)}")
        for run in final:
            event(f"run {run.status}, cleanup {run.cleanup_status}")
        for where in h.crashes:
            event(f"crashed at {where.partition('(')[2].rstrip(')')}")
        await assert_invariants(h, ids, before)

    scenario(database, body)


# -- named crash points, for failures that read at a glance -----------------------------------


def _step(action: str, attempts: int = 3, **params: Any) -> dict[str, Any]:
    return {"action": action, "with": params, "retry": {"attempts": attempts, "backoff": "200ms"}}


def _event(*phase_steps: list[dict[str, Any]], cleanup: str = "auto") -> dict[str, Any]:
    return {
        "id": "named-crash",
        "cleanup": cleanup,
        "phases": [{"name": f"phase {i}", "steps": s} for i, s in enumerate(phase_steps)],
    }


def test_crash_before_the_first_answers_are_recorded(database: Database) -> None:
    """The world was written and the process died before the answers committed: the
    placeholder and the lease row found the writes, the retry under the same key made
    nothing new, and cleanup took everything down."""

    async def body(h: Harness) -> None:
        definition = _event(
            [
                _step("sandbox.spawn", kind="orc", region="britain", count=3),
                _step("core.lease", lease="sandbox.weather", target="britain", value="storm"),
            ]
        )
        [run], before = await start(h, definition, Faults())
        plan = CrashPlan(name="record_outcomes")
        h.plan = plan
        with pytest.raises(SimulatedCrash):
            await drive(h, [run.id])
        assert h.world.snapshot() != before, "the crash should come after the world was written"
        states = {(r.kind, r.state) for r in await h.store.list_resources(run.id)}
        assert states == {("@step", "pending"), ("override", "pending")}
        await h.crash()
        [final] = await survive(h, [run.id], [])
        assert final.status == RunStatus.SUCCEEDED
        await assert_invariants(h, [run.id], before)

    scenario(database, body)


def test_crash_while_saving_a_lease_value(database: Database) -> None:
    """The process died saving the value a lease was about to overwrite: the world was
    not written, and the next worker read the value afresh and gave it back."""

    async def body(h: Harness) -> None:
        definition = _event(
            [_step("core.lease", lease="sandbox.xp_rate", value=3.0)],
            [_step("core.lease", lease="sandbox.weather", target="yew", value="fog")],
        )
        [run], before = await start(h, definition, Faults())
        plan = CrashPlan(name="save_lease_value")
        h.plan = plan
        with pytest.raises(SimulatedCrash):
            await drive(h, [run.id])
        assert h.world.snapshot() == before
        await h.crash()
        # And the second lease's save kills the next worker too.
        [final] = await survive(h, [run.id], [CrashPlan(name="save_lease_value", occurrence=2)])
        assert final.status == RunStatus.SUCCEEDED
        assert len(h.crashes) == 2
        await assert_invariants(h, [run.id], before)

    scenario(database, body)


def test_crash_in_the_middle_of_cleanup(database: Database) -> None:
    """The process died marking a revert done: the world had already removed the objects,
    the next worker's cleanup reverted them again as 'already gone', and nothing was
    removed twice."""

    async def body(h: Harness) -> None:
        definition = _event(
            [_step("sandbox.spawn", kind="orc", region="minoc", count=2)],
            [_step("sandbox.place_item", kind="chest", region="minoc", count=2)],
            [
                _step("sandbox.spawn", kind="troll", region="minoc", count=1),
                _step("core.lease", lease="sandbox.weather", target="minoc", value="snow"),
            ],
        )
        [run], before = await start(h, definition, Faults())
        plan = CrashPlan(name="mark_reverted", occurrence=2)
        h.plan = plan
        with pytest.raises(SimulatedCrash):
            await drive(h, [run.id])
        rows = await h.store.list_resources(run.id)
        assert {r.state for r in rows} >= {"reverted", "live"}, "the crash should land mid-cleanup"
        assert (await h.store.get_run(run.id)).cleanup_status == CleanupStatus.PENDING
        await h.crash()
        [final] = await survive(h, [run.id], [])
        assert final.cleanup_status == CleanupStatus.COMPLETE
        await assert_invariants(h, [run.id], before)

    scenario(database, body)


def test_revert_faults_leave_cleanup_incomplete_until_a_human_retries(database: Database) -> None:
    """Reverts that keep failing end the cleanup `incomplete`; once the fault is gone, a
    human's "clean up again" completes it — even when the process dies during the retry."""

    async def body(h: Harness) -> None:
        definition = _event([_step("sandbox.spawn", kind="orc", region="trinsic", count=2)])
        [run], before = await start(h, definition, Faults(failing_reverts=5))
        [ended] = await h.engine.settle([run.id], max_ticks=MAX_TICKS)
        assert ended.cleanup_status == CleanupStatus.INCOMPLETE
        [final] = await survive(h, [run.id], [CrashPlan(name="mark_reverted")])
        assert final.cleanup_status == CleanupStatus.COMPLETE
        assert h.crashes, "the human's retry should have been killed once"
        await assert_invariants(h, [run.id], before)

    scenario(database, body)

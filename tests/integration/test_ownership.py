"""Ownership (DESIGN §11): two owners never act on one step, cleanup or lease row.

Each test is one interleaving that broke the promise before claims were fenced, built
deterministically: a gate inside a module call holds one owner in the middle of its
work while another acts, then lets it go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import event
from sqlalchemy.pool import ConnectionPoolEntry
from tests.conftest import Harness, probe_module
from tests.databases import Database
from tests.integration.test_ledger_rules import one_step

from roadie.engine import Engine, EngineOptions, leases
from roadie.errors import ClaimLost, InvalidState, PermanentError, StoreError
from roadie.registry import Call, Module
from roadie.states import OVERRIDE_KIND, Reversible
from roadie.store import NewResource, Store
from roadie.store.migrate import alembic_config

HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()  # the newest migration

LEASE = """
id: borrow
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: borrow
        with: {{lease: probe.dial, value: {value}{hold}}}
"""


class Gate:
    """Holds the first call that reaches it until `open()`; later calls pass straight by."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self._open = asyncio.Event()
        self._used = False

    async def __call__(self, *_: Any) -> None:
        if self._used:
            return
        self._used = True
        self.reached.set()
        await self._open.wait()

    def open(self) -> None:
        self._open.set()


async def _live(h: Harness, run_id: int) -> list[tuple[str, str, str]]:
    return [(r.owner, r.kind, r.ref) for r in await h.store.list_resources(run_id, live_only=True)]


async def _second_engine(h: Harness, *, worker_id: str, fail_heartbeats: bool = False) -> Engine:
    """Another engine on the same database: another process, as far as the store knows."""
    store = await Store.open(h.database_url)

    def write_point(name: str) -> None:
        if fail_heartbeats and name == "heartbeat_worker":
            raise StoreError("heartbeat_worker: database is locked")

    store.write_point = write_point
    return Engine(store, h.registry, clock=h.clock, worker_id=worker_id, options=EngineOptions(seed=2))


def test_a_staff_click_during_an_automatic_cleanup_reverts_nothing_twice(harness: Harness) -> None:
    """Defect 1: the web service's engine shares the worker's id. Its cleanup of a run whose
    automatic cleanup is under way is refused (claims are tokens, not worker ids), and each
    step is reverted once."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [{"kind": "thing", "ref": "t-1"}]}, cleanup="manual"))
        [run] = await harness.settle(run)
        gate = Gate()
        harness.probe.observe_revert = gate
        automatic = asyncio.create_task(harness.engine.clean_up(run.id))
        await gate.reached.wait()
        web = await _second_engine(harness, worker_id=harness.engine.worker_id)
        try:
            with pytest.raises(InvalidState, match="under way elsewhere"):
                await web.clean_up(run.id, actor="staff")
        finally:
            gate.open()
            await web.store.close()
        report = await automatic
        assert report.status == "complete"
        keys = [r.idempotency_key for r in harness.probe.reverts]
        assert len(keys) == len(set(keys)) == 1

    harness.run(body)


def test_the_expiry_sweeper_and_a_cleanup_never_both_give_back_one_lease(harness: Harness) -> None:
    """Defect 2: while the sweeper restores an expired lease, the run's cleanup leaves the
    row alone (it cannot free the target), so no other run can borrow the target until
    the sweeper's restore has landed, and no restore lands over another run's value."""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(LEASE.format(value=5, hold=", for: 10s"))
        [a] = await harness.settle(a)
        assert harness.probe.dial == 5
        harness.clock.advance(11)
        gate = Gate()
        harness.probe.before_dial_write = gate
        sweeper = asyncio.create_task(
            leases.sweep_expired(harness.store, harness.registry, harness.clock, 60.0, incarnation="sweeper")
        )
        await gate.reached.wait()
        report = await harness.engine.clean_up(a.id)
        assert (report.status, report.held, report.restored) == ("pending", 1, 0)
        b = await harness.start(LEASE.format(value=7, hold=""), force=True)  # past pre-flight, to the ledger
        [b] = await harness.settle(b)
        gate.open()
        assert await sweeper == 1
        # Whoever holds the target now, the world shows their value: B was refused while
        # A's row was still being given back, so the value is the one from before A.
        holders = [r for r in await harness.store.leases_in_force()]
        assert holders == []
        assert b.status == "failed"
        assert harness.probe.dial == 1.5
        report = await harness.engine.clean_up(a.id)
        assert report.status == "complete"

    harness.run(body)


@pytest.mark.parametrize("fate", ["died", "failed"])
def test_a_cleanup_that_found_a_lease_held_by_another_restorer_leaves_the_run_pending(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, fate: str
) -> None:
    """The expiry sweeper took an expired lease, and a cleanup that came to the row found it
    held and left it. By the time the cleanup ends the sweeper has either died (its claim
    ran out) or failed (the world out of reach: it let the row go, live with why). Either
    way that cleanup tried nothing and failed nothing: the run stays `pending`, not
    `incomplete` (which asks a person), and the next cleanup gives the value back. (CI saw
    each: one run of fifty with workers being killed, and one in five of the random
    network test, seed 549628932.)"""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(LEASE.format(value=5, hold=", for: 10s"))
        [a] = await harness.settle(a)
        harness.clock.advance(11)
        [row] = [r for r in await harness.store.list_resources(a.id, live_only=True) if r.kind == OVERRIDE_KIND]
        assert await harness.store.claim_expired_lease(row.id, "sweeper", harness.clock.now(), 5.0)
        claim_row = harness.store.claim_lease_row

        async def then_the_sweeper_goes(*args: Any) -> bool:
            taken = await claim_row(*args)
            if fate == "died":
                harness.clock.advance(6)  # its claim runs out
            else:
                error = "expiry restore failed: no answer within 1s"
                await harness.store.release_lease_row(row.id, "sweeper", error, harness.clock.now())
            return taken

        monkeypatch.setattr(harness.store, "claim_lease_row", then_the_sweeper_goes)
        report = await harness.engine.clean_up(a.id)
        assert (report.status, report.held, report.failed) == ("pending", 1, 0), report
        monkeypatch.undo()
        assert harness.probe.dial == 5
        report = await harness.engine.clean_up(a.id)
        assert (report.status, report.restored) == ("complete", 1)
        assert harness.probe.dial == 1.5

    harness.run(body)


def test_a_module_cannot_hold_a_lease_target_beside_core(harness: Harness) -> None:
    """Defect 3: an `override` a module reports is rejected (rule 4), so it never makes a
    second live row for a lease target, and another run's `core.lease` of that target
    is the only holder."""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(
            one_step({"answer": [{"kind": "override", "ref": "probe.dial"}]}, cleanup="manual", event_id="sneaky")
        )
        [a] = await harness.settle(a)
        step = await harness.step(a, "make")
        assert step.rejections == ["probe.make reported a resource of the reserved kind 'override'"]
        b = await harness.start(LEASE.format(value=7, hold=""))
        [b] = await harness.settle(b)
        assert b.status == "succeeded"
        live = [(o, k, r) for o, k, r in [*await _live(harness, a.id), *await _live(harness, b.id)] if k == "override"]
        assert live == [("core", "override", "probe.dial")]

    harness.run(body)


def test_a_late_report_is_refused_while_a_cleanup_holds_the_run(harness: Harness) -> None:
    """Defect 4: a late report that arrives while a cleanup is under way is refused (in one
    transaction with the check), so the cleanup's verdict can never be `complete` with a
    live row recorded behind its back."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [{"kind": "thing", "ref": "t-1"}]}, cleanup="manual"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        gate = Gate()
        harness.probe.observe_revert = gate
        cleanup = asyncio.create_task(harness.engine.clean_up(run.id))
        await gate.reached.wait()
        try:
            with pytest.raises(InvalidState, match="cleanup has begun or ended"):
                await harness.store.record_late_resources(step, [NewResource("thing", "late-1")], harness.clock.now())
        finally:
            gate.open()
        report = await cleanup
        assert report.status == "complete"
        assert await _live(harness, run.id) == []
        with pytest.raises(InvalidState, match="cleanup has begun or ended"):
            await harness.store.record_late_resources(step, [NewResource("thing", "late-2")], harness.clock.now())

    harness.run(body)


def test_a_zombie_answer_writes_nothing(harness: Harness) -> None:
    """Defect 6: a worker whose claim expired (its heartbeats failed) answers after another
    worker has run the step again, ended the run and cleaned it up. Its answer is stale:
    no resource of it is recorded, no placeholder resolved, no live row left behind."""

    async def body() -> None:
        # The step may take longer than a claim lives: the claim, not the step's own
        # timeout, is what lets another worker take it over.
        run = await harness.start(one_step({"answer": None}, cleanup="manual", retry="timeout: 10m"))
        gate = Gate()

        async def zombie_answers(call: Any) -> None:
            first = not gate._used
            await gate(call)
            harness.probe.answer = [{"kind": "thing", "ref": "zombie-1" if first else "fresh-1"}]

        harness.probe.observe = zombie_answers
        zombie = await _second_engine(harness, worker_id="zombie", fail_heartbeats=True)
        try:
            stalled = asyncio.create_task(zombie.tick())
            await gate.reached.wait()
            harness.clock.advance(zombie.options.claim_ttl + 1)
            [run] = await harness.settle(run)
            assert run.status == "succeeded"
            assert (await harness.engine.clean_up(run.id)).status == "complete"
            harness.probe.answer = None
            gate.open()
            await harness.drive(stalled)
        finally:
            await zombie.store.close()
        assert await _live(harness, run.id) == []
        assert "zombie-1" not in [r.ref for r in await harness.resources(run)]
        assert (await harness.get_run(run)).cleanup_status == "complete"

    harness.run(body)


def test_a_worker_that_stops_gives_back_its_steps_with_their_attempts_counted(harness: Harness) -> None:
    """Defect 8: a step given back by a stopping worker may have reached the world (here its
    dispatch was under way when the worker's drain died), so its attempt counts; and only
    the claims of that worker's own incarnation are given back, not those of another
    process under the same worker id."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": None}, cleanup="manual"))
        gate = Gate()
        harness.probe.observe = gate
        other = await _second_engine(harness, worker_id=harness.engine.worker_id)
        try:
            dying = asyncio.create_task(other.tick())
            await gate.reached.wait()
            dying.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dying
            now = harness.clock.now()
            assert await harness.store.deregister_worker(harness.engine.worker_id, harness.engine.incarnation, now) == (
                0,
                0,
            )
            assert await other.store.deregister_worker(other.worker_id, other.incarnation, now) == (1, 0)
        finally:
            gate.open()
            await other.store.close()
        [step] = await harness.steps(run)
        assert (step.status, step.attempts, step.claim_token) == ("ready", 1, None)

    harness.run(body)


def test_workers_opening_one_new_database_together_migrate_it_once(tmp_path: Path, database: Database) -> None:
    """Defect 8: every store migrates on open; several processes opening an empty database
    at once take turns under a database lock instead of racing on the same DDL, and the
    schema they leave is whole."""
    url = database.fresh(tmp_path)

    async def main() -> None:
        stores = await asyncio.gather(*(Store.open(url) for _ in range(4)), return_exceptions=True)
        try:
            assert [s for s in stores if not isinstance(s, Store)] == []
            store = stores[0]
            assert isinstance(store, Store)
            async with store.engine.connect() as conn:
                version = (await conn.exec_driver_sql("SELECT version_num FROM alembic_version")).scalars().all()
            assert version == [HEAD]
        finally:
            for s in stores:
                if isinstance(s, Store):
                    await s.close()

    try:
        asyncio.run(main())
    finally:
        database.drop_all()


def test_a_connection_in_use_as_its_store_closes_is_closed_when_given_back(tmp_path: Path, database: Database) -> None:
    """The store's owner closes it while a task of its is still in a transaction (a
    heartbeat finishing as its worker stops): that connection is closed as the task gives
    it back, not kept by the pool the close disposed of, where nothing would close it."""
    url = database.fresh(tmp_path)

    async def main() -> list[Any]:
        store = await Store.open(url)
        given_back: list[ConnectionPoolEntry] = []
        event.listen(store.engine.sync_engine, "checkin", lambda _dbapi, entry: given_back.append(entry))
        async with store.engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")
            await store.close()
        return [entry.dbapi_connection for entry in given_back]

    try:
        assert asyncio.run(main()) == [None]
    finally:
        database.drop_all()


def test_cancelling_a_run_cuts_its_wait_short(harness: Harness) -> None:
    """Defect 8: a run sitting in `core.wait for: 10m` ends within a poll interval of being
    cancelled, instead of a step timeout later: core's own wait has nothing in the world
    to finish. The wait's step says it was cut short."""

    async def body() -> None:
        run = await harness.start(
            """
id: waiting
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.wait
        name: pause
        with: {for: 10m}
        timeout: 20m
"""
        )
        started = harness.clock.now()
        working = asyncio.create_task(harness.engine.tick())
        while [s.status for s in await harness.steps(run)] != ["running"]:
            await asyncio.sleep(0.01)
        assert await harness.engine.cancel_run(run.id)
        await harness.drive(working)
        [run] = await harness.settle(run)
        assert run.status == "cancelled"
        assert (harness.clock.now() - started).total_seconds() <= harness.options.poll_interval * 2
        step = await harness.step(run, "pause")
        assert (step.status, step.error) == ("skipped", "run cancelled: cut short")

    harness.run(body)


def _poison_module() -> Module:
    """`poison.fail`: refuses with a message holding a NUL byte, which PostgreSQL cannot
    keep in a text column: the one answer in a batch that the database refuses."""
    poison = Module("poison", "answers what the database cannot store")

    @poison.action("fail", reversible=Reversible.NONE)
    async def fail(call: Call[Any]) -> None:
        raise PermanentError("bad\x00byte")

    return poison


def test_one_answer_the_database_refuses_does_not_send_the_batch_back(
    make_harness: Callable[..., Harness],
) -> None:
    """Defect 8: a batch whose recording keeps failing was retried whole and then given up,
    so every good answer in it was dispatched again. Now it is recorded apart: the good
    answers go in once, and the one the database refuses ends its step as failed."""
    harness = make_harness(probe_module(), _poison_module())
    steps = "\n".join(
        f"      - {{action: probe.make, name: make{i}, with: {{answer: [{{kind: thing, ref: t-{i}}}]}}}}"
        for i in range(3)
    )
    event = f"""
id: batch
cleanup: manual
phases:
  - name: only
    steps:
{steps}
      - {{action: poison.fail, name: poisoned, on_error: continue}}
"""

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        by_name = {s.name: s for s in await harness.steps(run)}
        assert {n: (s.status, s.attempts) for n, s in by_name.items() if n != "poisoned"} == {
            f"make{i}": ("succeeded", 1) for i in range(3)
        }
        assert by_name["poisoned"].status == "failed"
        assert len(harness.probe.calls) == 3
        assert sorted(r.ref for r in await harness.resources(run, "thing")) == ["t-0", "t-1", "t-2"]

    harness.run(body)


@pytest.mark.parametrize(("second", "expected"), [("for: 10m", 3600.0), ("for: 2h", 7200.0), ("", None)])
def test_a_second_borrow_of_a_target_in_one_run_never_shortens_the_first(
    harness: Harness, second: str, expected: float | None
) -> None:
    """Defect 8: two `core.lease`s of one target in one run share its row; the later one
    used to overwrite the row's expiry, cutting the first borrow's time short. The row
    keeps the later of the two (no expiry being the latest)."""
    harness.probe.dial = 1.5
    event = f"""
id: twice
cleanup: manual
phases:
  - name: first
    steps:
      - action: core.lease
        with: {{lease: probe.dial, value: 2, for: 1h}}
  - name: second
    steps:
      - action: core.lease
        with: {{lease: probe.dial, value: 3{", " + second if second else ""}}}
"""

    async def body() -> None:
        started = harness.clock.now()
        run = await harness.start(event)
        while len([s for s in await harness.steps(run) if s.status == "succeeded"]) < 2:
            await harness.engine.tick()
        [row] = await harness.resources(run, "override")
        held = None if row.until is None else (row.until - started).total_seconds()
        assert held == expected
        assert harness.probe.dial == 3

    harness.run(body)


def test_a_lease_row_being_restored_cannot_be_forgotten_under_its_restorer(harness: Harness) -> None:
    """Issue 37: while the expiry sweeper is inside its restore write, an admin forgets the
    row. That used to free the target at once: run B borrowed it (7), the sweeper's
    restore then wrote 1.5 over B's value, and marked the `abandoned` row `reverted`. The
    forget is refused while the restorer's claim holds; B is refused the target while it
    is being given back; the world shows the value from before A."""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(LEASE.format(value=5, hold=", for: 10s"))
        [a] = await harness.settle(a)
        [row] = await harness.resources(a, OVERRIDE_KIND)
        harness.clock.advance(11)
        gate = Gate()
        harness.probe.before_dial_write = gate
        sweeper = asyncio.create_task(
            leases.sweep_expired(harness.store, harness.registry, harness.clock, 60.0, incarnation="sweeper")
        )
        await gate.reached.wait()
        try:
            with pytest.raises(InvalidState, match="being given back"):
                await harness.engine.cleanup.forget(row.id, actor="admin", reason="module gone")
            b = await harness.start(LEASE.format(value=7, hold=""), force=True)  # past pre-flight, to the ledger
            [b] = await harness.settle(b)
        finally:
            gate.open()
        assert await sweeper == 1
        assert b.status == "failed"
        assert harness.probe.dial == 1.5
        [row] = await harness.resources(a, OVERRIDE_KIND)
        assert row.state == "reverted"

    harness.run(body)


def test_a_forgotten_lease_row_is_never_marked_restored(harness: Harness) -> None:
    """A restorer whose claim ran out (it stalled) finds the row forgotten meanwhile: its
    late `mark_lease_restored` fails and the row stays `abandoned`, never `reverted`."""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(LEASE.format(value=5, hold=", for: 10s"))
        [a] = await harness.settle(a)
        [row] = await harness.resources(a, OVERRIDE_KIND)
        harness.clock.advance(11)
        assert await harness.store.claim_expired_lease(row.id, "stalled", harness.clock.now(), 5.0)
        harness.clock.advance(6)  # the stalled restorer's claim runs out
        await harness.engine.cleanup.forget(row.id, actor="admin", reason="module gone")
        with pytest.raises(ClaimLost):
            await harness.store.mark_lease_restored(row.id, "stalled", harness.clock.now())
        await harness.store.release_lease_row(row.id, "stalled", "too late", harness.clock.now())
        [row] = await harness.resources(a, OVERRIDE_KIND)
        assert (row.state, row.claim_token) == ("abandoned", None)
        assert str(row.error).startswith("forgotten by admin")

    harness.run(body)


def test_a_cleanup_whose_claim_had_expired_when_it_committed_acts_on_nothing(harness: Harness) -> None:
    """Issue 37: the database took longer than a cleanup claim's lifetime to commit it, so
    the claim was born expired and a second cleanup (a staff click) could take it at
    once: both reverted the step. A claim already expired when it committed acts on
    nothing: one revert call for the step."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [{"kind": "thing", "ref": "t-1"}]}, cleanup="manual"))
        [run] = await harness.settle(run)
        slow = [True]

        def slow_commit(name: str) -> None:
            if name == "claim_cleanup" and slow:
                slow.clear()
                harness.clock.advance(harness.engine.cleanup.claim_ttl + 1)

        harness.write_points.extra = slow_commit
        gate = Gate()
        harness.probe.observe_revert = gate
        first = asyncio.create_task(harness.engine.clean_up(run.id))
        reached = asyncio.create_task(gate.reached.wait())
        await asyncio.wait([first, reached], return_when=asyncio.FIRST_COMPLETED)
        if not gate.reached.is_set():
            gate.open()  # the first cleanup made no call: the staff's passes by
        try:
            report = await harness.engine.clean_up(run.id, actor="staff")
        finally:
            gate.open()
            reached.cancel()
        assert report.status == "complete"
        with pytest.raises(ClaimLost):
            await first
        keys = [r.idempotency_key for r in harness.probe.reverts]
        assert len(keys) == len(set(keys)) == 1

    harness.run(body)


def test_a_worker_whose_claim_ran_out_never_lands_its_borrow(harness: Harness) -> None:
    """Issue 37, item 2: worker E1 borrows the dial (5) under a step with `timeout: 10m`
    (claims live 60 s) and stalls reading it; its heartbeats fail. Once its own clock
    passes the claim's expiry it cuts the call: it saves nothing and never writes the
    world. E2 takes the step over, run A ends and its cleanup restores 1.5, run B borrows
    7, and E1's borrow, let go at last, lands nowhere: the world keeps B's 7 (it used to
    end at 5)."""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(LEASE.format(value=5, hold="").replace("value: 5}", "value: 5}\n        timeout: 10m"))
        gate = Gate()
        harness.probe.observe_dial_read = gate
        e1 = await _second_engine(harness, worker_id="e1", fail_heartbeats=True)
        e1_writes: list[str] = []
        e1.store.write_point = lambda name: e1_writes.append(name) or _fail_heartbeat(name)
        try:
            stalled = asyncio.create_task(e1.tick())
            await gate.reached.wait()
            harness.clock.advance(e1.options.claim_ttl + 1)
            # E1's own clock has passed its claim: it cuts the call, and its pass ends (the
            # step is to be tried again later). A bound in real time, not a pause: the
            # engine of old never ends this pass, and the scenario goes on without it.
            await asyncio.wait({stalled}, timeout=10)
            [a] = await harness.settle(a)  # E2 takes the step over
            assert (a.status, harness.probe.dial) == ("succeeded", 5)
            assert (await harness.engine.clean_up(a.id)).status == "complete"
            assert harness.probe.dial == 1.5
            b = await harness.start(LEASE.format(value=7, hold="").replace("id: borrow", "id: borrow-b"))
            [b] = await harness.settle(b)
            assert (b.status, harness.probe.dial) == ("succeeded", 7)
            gate.open()
            await harness.drive(stalled)
        finally:
            gate.open()
            await e1.store.close()
        assert harness.probe.dial == 7
        assert "save_lease_value" not in e1_writes

    harness.run(body)


def _fail_heartbeat(name: str) -> None:
    if name == "heartbeat_worker":
        raise StoreError("heartbeat_worker: database is locked")


def test_a_borrow_saves_nothing_under_a_claim_it_no_longer_holds(harness: Harness) -> None:
    """Issue 37, item 2: the saved value of a borrow is written under the step's claim,
    checked in the same transaction: a token that is not the step's, or a claim that
    has run out, saves nothing."""
    harness.probe.dial = 1.5

    async def body() -> None:
        a = await harness.start(LEASE.format(value=5, hold=""))
        [a] = await harness.settle(a)
        [row] = await harness.resources(a, OVERRIDE_KIND)
        [step] = await harness.steps(a)
        with pytest.raises(ClaimLost):
            await harness.store.save_lease_value(row.id, 9.0, harness.clock.now(), step_id=step.id, token="stale")
        with pytest.raises(ClaimLost):
            await harness.store.save_lease_value(row.id, 9.0, harness.clock.now(), step_id=step.id, token=None)
        [row] = await harness.resources(a, OVERRIDE_KIND)
        assert row.payload == {"saved": 1.5}

    harness.run(body)

"""Cleanup, the read-and-undo half of the ledger (DESIGN §5)."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from typing import Any

import pytest
from tests.conftest import Harness

import roadie.engine.cleanup as cleanup_module
import roadie.store.ledger as ledger_module
from roadie.errors import InvalidState, StoreError


def things(*refs: str, member: str | None = None) -> list[dict[str, Any]]:
    extra = {"memberKey": member} if member else {}
    return [{"kind": "thing", "ref": ref, **extra} for ref in refs]


def phases(*answers: list[dict[str, Any]], cleanup: str = "auto", duration: str = "0s", event_id: str = "c") -> str:
    """An event with one phase per answer, each one `probe.make` step named `make<i>`."""
    body = "".join(
        f"""
  - name: phase{i}
    steps:
      - action: probe.make
        name: make{i}
        with: {{answer: {json.dumps(answer)}}}"""
        for i, answer in enumerate(answers)
    )
    return f"id: {event_id}\ncleanup: {cleanup}\nduration: {duration}\nphases:{body}\n"


SPAWN_TWO = """
id: spawn
cleanup: manual
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 2}
"""


def test_cleanup_undoes_newest_first(harness: Harness) -> None:
    """Steps are reverted in reverse order of creation, and so are a step's resources."""

    async def body() -> None:
        run = await harness.start(phases(things("a1", "a2"), things("b1"), things("c1", "c2", "c3")))
        await harness.settle(run)
        order = [[r.ref for r in call.resources] for call in harness.probe.reverts]
        assert order == [["c3", "c2", "c1"], ["b1"], ["a2", "a1"]]

    harness.run(body)


def test_cleanup_pages_through_a_run_in_bounded_pages(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """With pages of 3 rows, a run of 7 resources in 4 steps is cleaned up over two pages,
    still newest first, one call per step even when its rows run past the page (c1), and
    each page's reverts recorded in one write."""
    monkeypatch.setattr(cleanup_module, "PAGE_ROWS", 3)

    async def body() -> None:
        run = await harness.start(phases(things("a1", "a2"), things("b1"), things("c1", "c2", "c3"), things("d1")))
        before = harness.store_writes("mark_reverted")
        [run] = await harness.settle(run)
        order = [[r.ref for r in call.resources] for call in harness.probe.reverts]
        assert order == [["d1"], ["c3", "c2", "c1"], ["b1"], ["a2", "a1"]]
        assert run.cleanup_status == "complete"
        assert harness.store_writes("mark_reverted") - before == 2

    harness.run(body)


def test_one_batched_revert_per_step(harness: Harness) -> None:
    """A step that made five resources is reverted by one call carrying all five, under
    the step's idempotency key."""

    async def body() -> None:
        run = await harness.start(phases(things("t1", "t2", "t3", "t4", "t5")))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make0")
        [call] = harness.probe.reverts
        assert (call.run_id, call.idempotency_key) == (run.id, step.idempotency_key)
        assert sorted(r.ref for r in call.resources) == ["t1", "t2", "t3", "t4", "t5"]
        assert [r.state for r in await harness.resources(run, "thing")] == ["reverted"] * 5

    harness.run(body)


XP = """
id: xp
duration: 1m
phases:
  - name: only
    steps:
      - action: core.lease
        with: {lease: sandbox.xp_rate, value: 3.0}
"""


def test_a_borrowed_value_is_restored_by_core_from_the_saved_value(harness: Harness) -> None:
    """Core restores an override itself, writing back the value saved in the row before
    the borrow, over the value it wrote (compare before write, DESIGN §12)."""
    harness.world.set_setting("xp_rate", 1.5)

    async def body() -> None:
        run = await harness.start(XP)
        [run] = await harness.settle(run)
        assert (run.cleanup_status, harness.world.read_setting("xp_rate")) == ("complete", 1.5)
        [row] = await harness.resources(run)
        assert (row.owner, row.state, row.payload) == ("core", "reverted", {"saved": 1.5})
        assert run.cleanup_report is not None
        assert (run.cleanup_report["restored"], run.cleanup_report["left_alone"]) == (1, 0)

    harness.run(body)


def test_a_value_someone_set_meanwhile_is_left_alone_and_reported(harness: Harness) -> None:
    """Someone sets the rate by hand while the run holds it: cleanup does not write the
    saved value over theirs; it frees the target and reports the value it found."""
    harness.world.set_setting("xp_rate", 1.5)

    async def body() -> None:
        run = await harness.start(XP)
        await harness.engine.tick()
        assert harness.world.read_setting("xp_rate") == 3.0
        harness.world.set_setting("xp_rate", 7.0)  # someone else changed it meanwhile
        [run] = await harness.settle(run)
        assert (run.cleanup_status, harness.world.read_setting("xp_rate")) == ("complete", 7.0)
        assert run.cleanup_report is not None
        assert (run.cleanup_report["restored"], run.cleanup_report["left_alone"]) == (0, 1)
        [finding] = run.cleanup_report["verification"]["findings"]
        assert (finding["finding"], finding["ref"]) == ("changed", "sandbox.xp_rate")
        assert await harness.store.leases_in_force() == []

    harness.run(body)


def test_reverting_what_is_already_gone_is_a_success(harness: Harness) -> None:
    """A creature killed by a player before cleanup counts as reverted, not failed."""
    before = harness.world.snapshot()

    async def body() -> None:
        run = await harness.start(SPAWN_TWO)
        await harness.settle(run)
        first, _ = await harness.resources(run, "creature")
        assert harness.world.destroy(first.ref)
        report = await harness.engine.clean_up(run.id, actor="ops")
        assert (report.status, report.reverted, report.failed, report.errors) == ("complete", 2, 0, [])
        assert harness.world.snapshot() == before

    harness.run(body)


def test_reverted_rows_are_kept_and_free_their_target(harness: Harness) -> None:
    """A reverted row stays in the ledger as `reverted`, and its target can be recorded
    again by another run without a rejection."""
    event = phases(things("shared"))

    async def body() -> None:
        first = await harness.start(event)
        await harness.settle(first)
        [old] = await harness.resources(first, "thing")
        assert old.state == "reverted"
        assert old.reverted_at is not None
        second = await harness.start(event)
        [second] = await harness.settle(second)
        assert (await harness.step(second, "make0")).rejections is None
        [new] = await harness.resources(second, "thing")
        assert (new.ref, new.state) == ("shared", "reverted")
        assert [r.id for r in await harness.resources(first, "thing")] == [old.id]

    harness.run(body)


def test_a_failed_revert_leaves_the_run_incomplete_until_a_human_retries(harness: Harness) -> None:
    """A revert that fails keeps its rows live with the error and attempt count, the run
    ends `incomplete`, and `clean_up(again=True)` finishes the job."""
    before = harness.world.snapshot()
    harness.world.fail_reverts_next(1)

    async def body() -> None:
        run = await harness.start(SPAWN_TWO.replace("manual", "auto"))
        [run] = await harness.settle(run)
        assert run.cleanup_status == "incomplete"
        assert run.cleanup_report is not None
        assert run.cleanup_report["failed"] == 2
        rows = await harness.resources(run, "creature")
        assert [(r.state, r.attempts, r.error) for r in rows] == [("live", 1, "sandbox: injected revert failure")] * 2
        assert len(harness.world.snapshot()["creatures"]) == 2
        report = await harness.engine.clean_up(run.id, actor="ops", again=True)
        assert (report.status, report.reverted) == ("complete", 2)
        rows = await harness.resources(run, "creature")
        assert [(r.state, r.attempts, r.error) for r in rows] == [("reverted", 2, None)] * 2
        assert (await harness.get_run(run)).cleanup_status == "complete"
        assert harness.world.snapshot() == before

    harness.run(body)


def test_a_plan_lists_the_calls_without_making_them(harness: Harness) -> None:
    """`plan` answers every call cleanup would make, newest first: a batched revert, a
    key-only revert for a lost answer, core's restore of a lease; nothing changes."""
    harness.world.lose_next(5, action="place_item")
    event = """
id: plan
cleanup: manual
phases:
  - name: omens
    steps:
      - action: core.lease
        name: sky
        with: {lease: sandbox.weather, target: britain, value: storm}
  - name: wave
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 2}
  - name: loot
    steps:
      - action: sandbox.place_item
        name: chest
        with: {kind: chest, region: britain}
        retry: {attempts: 1}
        on_error: continue
"""

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        world, ledger = harness.world.snapshot(), await harness.resources(run)
        plan = await harness.engine.cleanup.plan(run.id)
        assert [(c.kind, c.step, len(c.resources)) for c in plan] == [
            ("revert-by-key", "chest", 0),
            ("revert", "orcs", 2),
            ("restore", "sky", 1),
        ]
        assert plan[2].resources[0]["payload"] == {"saved": "clear"}
        assert harness.world.snapshot() == world
        assert await harness.resources(run) == ledger
        assert (await harness.get_run(run)).cleanup_status == "pending"

    harness.run(body)


def test_cleanup_scoped_to_a_member_reverts_only_theirs(harness: Harness) -> None:
    """A cleanup for one memberKey reverts that member's resources, even while the run
    goes on, and leaves the other rows and the run's cleanup status alone."""
    answer = things("a1", "a2", member="alice") + things("b1", member="bob") + things("everyone")
    event = phases(answer, cleanup="manual", duration="1h")

    async def body() -> None:
        run = await harness.start(event)
        await harness.engine.tick()
        report = await harness.engine.clean_up(run.id, actor="ops", member_key="alice")
        assert (report.status, report.member_key, report.reverted) == ("complete", "alice", 2)
        [call] = harness.probe.reverts
        assert sorted(r.ref for r in call.resources) == ["a1", "a2"]
        assert {r.member_key for r in call.resources} == {"alice"}
        states = {r.ref: r.state for r in await harness.resources(run, "thing")}
        assert states == {"a1": "reverted", "a2": "reverted", "b1": "live", "everyone": "live"}
        run = await harness.get_run(run)
        assert (run.status, run.cleanup_status) == ("running", "pending")

    harness.run(body)


def test_a_full_cleanup_needs_the_run_to_have_ended(harness: Harness) -> None:
    """A run in flight is stopped by cancelling it; a whole cleanup of it is refused."""

    async def body() -> None:
        run = await harness.start(phases(things("x"), duration="1h"))
        await harness.engine.tick()
        with pytest.raises(InvalidState, match="cancel it first"):
            await harness.engine.clean_up(run.id, actor="ops")
        [row] = await harness.resources(run, "thing")
        assert row.state == "live"

    harness.run(body)


def test_forget_abandons_a_resource_audited_and_named_in_the_report(harness: Harness) -> None:
    """An admin can forget a resource that can never be reverted: it is kept as
    `abandoned`, the audit log has who and why, and the next cleanup completes and
    names it in `forgotten`."""
    harness.probe.broken_reverts = True

    async def body() -> None:
        run = await harness.start(phases(things("cursed")))
        [run] = await harness.settle(run)
        assert run.cleanup_status == "incomplete"
        [row] = await harness.resources(run, "thing")
        await harness.engine.cleanup.forget(row.id, actor="admin", reason="the probe module was retired")
        [row] = await harness.resources(run, "thing")
        assert row.state == "abandoned"
        [audit] = [a for a in await harness.store.list_audit(f"run:{run.id}") if a.action == "resource.forget"]
        assert audit.actor == "admin"
        assert audit.detail["reason"] == "the probe module was retired"
        assert audit.detail["resource"] == row.id
        reverts = len(harness.probe.reverts)
        report = await harness.engine.clean_up(run.id, actor="admin", again=True)
        assert report.status == "complete"
        assert len(harness.probe.reverts) == reverts  # nothing left to call
        assert [f["resource"] for f in report.forgotten] == [row.id]
        assert (await harness.get_run(run)).cleanup_status == "complete"

    harness.run(body)


@pytest.mark.parametrize("reason", ["", "   "])
def test_forget_without_a_reason_is_refused(harness: Harness, reason: str) -> None:
    """Nothing is dropped silently: forgetting needs a reason, and a refused forget
    leaves the row live and writes no audit entry."""
    harness.probe.broken_reverts = True

    async def body() -> None:
        run = await harness.start(phases(things("cursed")))
        await harness.settle(run)
        [row] = await harness.resources(run, "thing")
        with pytest.raises(InvalidState, match="needs a reason"):
            await harness.engine.cleanup.forget(row.id, actor="admin", reason=reason)
        [row] = await harness.resources(run, "thing")
        assert row.state == "live"
        assert not [a for a in await harness.store.list_audit() if a.action == "resource.forget"]

    harness.run(body)


def test_an_expired_lease_is_restored_while_the_run_goes_on(harness: Harness) -> None:
    """A lease with `for: 10s` is given back by the sweeper after 10s, while its run is
    still running; cleanup later has nothing left to restore."""
    event = """
id: squall
duration: 1h
phases:
  - name: only
    steps:
      - action: core.lease
        with: {lease: sandbox.weather, target: britain, value: storm, for: 10s}
"""

    async def body() -> None:
        run = await harness.start(event)
        await harness.engine.tick()
        assert harness.world.read_weather("britain") == "storm"
        harness.clock.advance(9)
        await harness.engine.tick()
        assert harness.world.read_weather("britain") == "storm"
        harness.clock.advance(1)
        await harness.engine.tick()
        assert harness.world.read_weather("britain") == "clear"
        assert (await harness.get_run(run)).status == "running"
        [row] = await harness.resources(run)
        assert row.state == "reverted"
        await harness.engine.cancel_run(run.id)
        [run] = await harness.settle(run)
        assert run.cleanup_status == "complete"
        assert run.cleanup_report is not None
        assert run.cleanup_report["restored"] == 0

    harness.run(body)


@pytest.mark.parametrize("point", ["claim_lease_row", "mark_reverted"])
def test_a_database_failure_during_cleanup_is_not_a_refusal_by_the_world(harness: Harness, point: str) -> None:
    """A cleanup whose write is lost with its connection (the commit's fate unknown, so the
    store raises) stops there: the row keeps no error and counts no attempt, the run stays
    `pending`, and the cleanup that comes once the claim runs out finishes the job. It is
    never counted as the world refusing the restore, which would leave it `incomplete`."""
    harness.world.set_setting("xp_rate", 1.5)
    failures = {"left": 1}

    def lost_commit(name: str) -> None:
        if name == point and failures["left"]:
            failures["left"] -= 1
            raise StoreError(f"{name}: the connection was lost while committing: server closed the connection")

    harness.write_points.extra = lost_commit
    event = """
id: xp
duration: 1m
cleanup: auto
phases:
  - name: only
    steps:
      - action: core.lease
        with: {lease: sandbox.xp_rate, value: 3.0}
"""

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        assert failures["left"] == 0
        assert run.cleanup_status == "complete"
        assert harness.world.read_setting("xp_rate") == 1.5
        [row] = await harness.resources(run)
        assert (row.state, row.attempts, row.error) == ("reverted", 1, None)  # the one that got through
        assert run.cleanup_report is not None
        assert (run.cleanup_report["restored"], run.cleanup_report["failed"]) == (1, 0)

    harness.run(body)


def test_a_cleanup_of_a_run_the_planner_does_not_know_of_freshens_its_statistics(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL plans by statistics that autovacuum refreshes a minute or so after a table
    grows; a run that filled the ledger faster would have each page of its cleanup read by
    walking every live row (100,000 rows at 10 per step took 13.9 s, 8.9 s with fresh
    statistics). Its cleanup asks for them first, once; the others have nothing to do."""
    monkeypatch.setattr(ledger_module, "FRESHEN_ABOVE", 3)

    async def body() -> None:
        run = await harness.start(phases(things("a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"), cleanup="manual"))
        [run] = await harness.settle(run)
        freshened = await harness.store.freshen_ledger_statistics(run.id)
        assert freshened == (harness.store.dialect == "postgresql")
        assert not await harness.store.freshen_ledger_statistics(run.id)  # pg_class knows of it now
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.reverted) == ("complete", 8)

    harness.run(body)


def test_a_cleanup_holds_no_more_memory_for_a_run_of_many_steps(harness: Harness) -> None:
    """Issue 14 (memory bounded): a cleanup reads a run's ledger a page at a time, and
    never its frozen definition, which grows with the run's steps (to megabytes). A run
    of 3000 steps, one of which made something: its cleanup's peak of Python memory is
    a fraction of what decoding that definition alone takes."""
    quiet = "\n".join(f"      - {{action: probe.make, name: quiet{i}, with: {{answer: []}}}}" for i in range(3000))
    text = f"""
id: wide
cleanup: manual
phases:
  - name: only
    steps:
      - action: probe.make
        name: maker
        with: {{answer: [{{kind: thing, ref: one}}]}}
{quiet}
"""

    async def body() -> None:
        run = await harness.start(text)
        await harness.settle(run, max_ticks=10_000)
        whole = await harness.get_run(run)
        tracemalloc.start()
        json.loads(json.dumps(whole.definition))
        _, decoding = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        current, _ = tracemalloc.get_traced_memory()
        report = await harness.engine.clean_up(run.id, actor="ops")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert (report.status, report.reverted) == ("complete", 1)
        assert peak - current < decoding / 3, (peak - current, decoding)

    harness.run(body)


def test_a_stopping_worker_gives_back_a_cleanup_its_dead_module_holds_up(harness: Harness) -> None:
    """Before: a worker told to stop waited for its automatic cleanups to end, and with
    their module down each call waited out its deadline (a Luanti cleanup of four
    inspections held a SIGTERM up for 7 minutes; after a SIGKILL its claim held the
    cleanup for the claim's lifetime). Now the call under way ends, what is done is
    recorded, and the cleanup is given back: no further call is made, it is due again at
    once, and the next worker finishes it once the module is back."""
    entered: list[str] = []

    async def dead(call: Any) -> None:
        entered.append(call.idempotency_key)
        await asyncio.Event().wait()  # a module that never answers: the call's deadline ends it

    async def body() -> None:
        run = await harness.start(phases(things("a"), things("b"), things("c")))
        harness.probe.observe_revert = dead
        worker = asyncio.create_task(harness.engine.run_forever())

        async def reverting() -> None:
            while not entered:
                await asyncio.sleep(0.01)

        await harness.drive(reverting())
        harness.engine.stop()
        await harness.drive(worker)
        assert len(entered) == 1  # before: all three, each waited out
        assert (await harness.get_run(run)).cleanup_status == "pending"
        assert await harness.store.runs_due_cleanup(harness.clock.now()) == [run.id]  # given back, not left to expire
        assert sorted(r.state for r in await harness.resources(run, "thing")) == ["live"] * 3

        harness.probe.observe_revert = None  # the module is back
        await harness.restart()
        [ended] = await harness.settle(run)
        assert ended.cleanup_status == "complete"
        assert sorted(r.state for r in await harness.resources(run, "thing")) == ["reverted"] * 3

    harness.run(body)

"""Fences reach the world (issue 37, item 1; docs/protocol.md §4, rule 7).

The database refuses every write of an owner whose claim has lapsed, but the world is not
the database: a call already on its way still lands. Each call that changes the world
carries a fence minted with its claim, and a module that remembers the highest it has
accepted per step key or lease target refuses the rest. The `probe` module of these tests
refuses as a module must; each test is a lapse the database alone cannot stop, because the
lapsed worker's own clock never saw its claim run out (a paused process, a clock behind).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from tests.conftest import Harness
from tests.integration.test_ledger_rules import one_step
from tests.integration.test_ownership import LEASE, Gate

from roadie.clock import FakeClock
from roadie.engine import Engine, EngineOptions
from roadie.errors import ClaimLost, PermanentError
from roadie.store import Store


async def _lapsing_engine(h: Harness, worker_id: str) -> Engine:
    """Another worker on the same database whose clock stands still: it never sees its
    claim run out, so nothing but the fence can stop what it has in flight."""
    store = await Store.open(h.database_url)
    frozen = FakeClock(h.clock.now())
    return Engine(store, h.registry, clock=frozen, worker_id=worker_id, options=EngineOptions(seed=3))


@asynccontextmanager
async def _stalled_past_its_claim(h: Harness, gate: Gate) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """E1, a worker whose clock stands still, ticks until it stops at `gate` (which the
    caller has put in the probe), and its claim runs out on everyone else's clock. Yields
    `land`: let E1 go on from the gate, and wait for its tick to end."""
    e1 = await _lapsing_engine(h, "e1")
    try:
        stalled = asyncio.create_task(e1.tick())
        await gate.reached.wait()
        h.clock.advance(e1.options.claim_ttl + 1)

        async def land() -> None:
            gate.open()
            await h.drive(stalled)

        yield land
    finally:
        gate.open()
        await e1.store.close()


@asynccontextmanager
async def _borrow_stalled_before_its_write(h: Harness) -> AsyncIterator[tuple[int, Callable[[], Awaitable[None]]]]:
    """Run A borrows the dial's value 5 (its step may take 10 minutes). E1 reads and saves
    what the dial shows, then stalls before its write past its claim. Yields A's id, and
    `land` (`_stalled_past_its_claim`)."""
    a = await h.start(LEASE.format(value=5, hold="").replace("value: 5}", "value: 5}\n        timeout: 10m"))
    gate = Gate()
    h.probe.before_dial_write = gate
    async with _stalled_past_its_claim(h, gate) as land:
        yield a.id, land


def test_fences_grow_with_every_claim_of_a_step_and_its_cleanup(harness: Harness) -> None:
    """A step retried after a failed attempt is claimed again, under a higher fence; its
    cleanup's revert carries a higher one still."""

    async def body() -> None:
        run = await harness.start(
            one_step({"fail_first": 1, "answer": [{"kind": "thing", "ref": "t-1"}]}, cleanup="manual")
        )
        [run] = await harness.settle(run)
        fences = [c.fence for c in harness.probe.calls]
        assert len(fences) == 2
        assert 0 < fences[0] < fences[1]
        report = await harness.engine.clean_up(run.id)
        assert report.status == "complete"
        [revert] = harness.probe.reverts
        assert revert.fence > fences[1]

    harness.run(body)


def test_a_lapsed_workers_borrow_is_refused_by_the_world(harness: Harness) -> None:
    """The issue's first reproduction, with a worker whose clock never shows its claim
    running out. E1 reads and saves the dial's 1.5, then stalls before its write of 5. E2
    takes the step over and writes 5, run A's cleanup gives 1.5 back, run B borrows 7.
    E1's write then lands, under the fence of its old claim: the module refuses it, and
    the world keeps B's 7 (without fences it ended at 5, and B's cleanup called itself
    verified clean)."""
    harness.probe.dial = 1.5

    async def body() -> None:
        async with _borrow_stalled_before_its_write(harness) as (run, land):
            [a] = await harness.settle(run)  # E2 takes the step over
            assert (a.status, harness.probe.dial) == ("succeeded", 5)
            assert (await harness.engine.clean_up(a.id)).status == "complete"
            assert harness.probe.dial == 1.5
            b = await harness.start(LEASE.format(value=7, hold="").replace("id: borrow", "id: borrow-b"))
            [b] = await harness.settle(b)
            assert (b.status, harness.probe.dial) == ("succeeded", 7)
            await land()
        assert harness.probe.dial == 7
        assert [value for value, _ in harness.probe.written] == [5, 1.5, 7]
        fences = [fence for _, fence in harness.probe.written]
        assert fences == sorted(fences)
        assert len(set(fences)) == 3
        # B's cleanup still has B's value to give back, and gives back A's original.
        assert (await harness.engine.clean_up(b.id)).status == "complete"
        assert harness.probe.dial == 1.5

    harness.run(body)


def test_a_lapsed_workers_dispatch_after_the_cleanup_makes_nothing(harness: Harness) -> None:
    """The same lapse with a ledger action: E1 stalls inside its dispatch, E2 does the step,
    the run ends and is cleaned up. E1's dispatch, let go, is refused by the module (the
    cleanup's revert raised the key's mark): nothing is made after the cleanup ended."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [{"kind": "thing", "ref": "t-1"}]}, cleanup="manual"))
        gate = Gate()
        harness.probe.observe = gate
        async with _stalled_past_its_claim(harness, gate) as land:
            [run] = await harness.settle(run)
            assert run.status == "succeeded"
            assert (await harness.engine.clean_up(run.id)).status == "complete"
            await land()
        outcomes = [c.outcome for c in harness.probe.calls]
        assert outcomes == ["raised", "answered"]  # E1's, refused; E2's
        assert [c.fence for c in harness.probe.calls] == sorted(c.fence for c in harness.probe.calls)

    harness.run(body)


def test_a_layer_is_not_changed_for_a_step_whose_claim_is_gone(harness: Harness) -> None:
    """A layered borrow changes its stack under the stack's own claim, and mints its fence
    with it: that claim is only taken while the step's claim holds, in one transaction,
    or a worker whose step was taken over could take the stack and a fresh fence."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": []}, cleanup="manual"))
        [run] = await harness.settle(run)
        [step] = await harness.steps(run)
        with pytest.raises(ClaimLost):
            await harness.store.claim_stack(
                "probe.dial", "stack.t", harness.clock.now(), 60, for_step=(step.id, "stale-token")
            )
        assert await harness.store.claim_stack("probe.dial", "stack.t", harness.clock.now(), 60) is not None

    harness.run(body)


def test_a_lapsed_borrow_that_lands_after_its_runs_cleanup_is_refused(harness: Harness) -> None:
    """Found by the simulation's 10,000 seeds (seed 656). E1 reads and saves the dial's 1.5,
    then stalls before its write of 5; its claim runs out, the run is cancelled and cleaned
    up. The restore found the world showing 1.5 already and wrote nothing, so the world
    held no fence above E1's: E1's write then landed, and the world kept 5 with no row
    left to give it back. The restore now writes 1.5 all the same, under its claim's
    fence, and E1's late write is refused."""
    harness.probe.dial = 1.5

    async def body() -> None:
        async with _borrow_stalled_before_its_write(harness) as (run, land):
            await harness.engine.cancel_run(run, actor="staff")
            [a] = await harness.settle(run)
            assert a.status == "cancelled"
            assert (await harness.engine.clean_up(a.id)).status == "complete"
            await land()
        assert harness.probe.dial == 1.5
        assert [value for value, _ in harness.probe.written] == [1.5]  # the restore's; E1's refused

    harness.run(body)


def test_a_layer_popped_where_the_world_shows_what_is_below_is_written_all_the_same(harness: Harness) -> None:
    """The same hole with a lease that stacks (the simulation's seed 6008): a layer was put
    on the stack but its write never landed where the pop could see it, so the world
    showed the value below already, and the pop wrote nothing. A write of the layer
    still on its way (its worker cut off) then landed after the pop and stayed. The pop
    now writes the value below all the same, under the stack's new fence, higher than
    the layer's: the world refuses the layer's write if it comes."""
    harness.probe.dial = 1.5
    lease = harness.registry.lease("probe.dial")
    lease.stacks = True
    layered = LEASE.format(value=5, hold=", priority: 3")
    lost: list[int] = []

    async def write_lost(call: Any, value: Any) -> None:
        if not lost:
            lost.append(call.fence)
            raise PermanentError("the write is on its way still, and the step gives up on it")

    async def body() -> None:
        harness.probe.before_dial_write = write_lost
        a = await harness.start(layered)
        [a] = await harness.settle(a)
        assert a.status == "failed"
        assert harness.probe.dial == 1.5
        assert (await harness.engine.clean_up(a.id)).status == "complete"
        assert [value for value, _ in harness.probe.written] == [1.5]  # before: nothing written
        [(_, popped)] = harness.probe.written
        assert popped > lost[0]

    try:
        harness.run(body)
    finally:
        lease.stacks = False

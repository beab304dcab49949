"""A run keeps its setup while it runs (issue 37, item 4).

A server that restarts mid-event shows its settings as its configuration has them again,
and has lost what the event made. The runs here borrow a setting, then wait an hour for
their second phase; meanwhile the world "restarts" (the test sets the setting back, or
removes what was made), and the worker's next look puts the borrow back, leaves a value
set by hand alone, and tells staff what was lost, in the run's audit."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.conftest import Harness

from roadie.engine.keep import LOST_GRACE
from roadie.errors import AnswerLost
from roadie.store.queue import QueueStore

HOLDING = """
id: holding
cleanup: manual
phases:
  - name: setup
    steps:
      - action: core.lease
        name: borrow
        with: {lease: probe.dial, value: 5}
  - name: later
    after: 1h
    steps:
      - action: core.log
        name: note
        with: {message: "still here"}
"""

SPAWNING = """
id: spawning
cleanup: manual
phases:
  - name: setup
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
  - name: later
    after: 1h
    steps:
      - action: core.log
        name: note
        with: {message: "still here"}
"""


async def _look(h: Harness, seconds: float) -> None:
    """Let `seconds` pass, then let the worker tick and finish its look at the setups."""
    h.clock.advance(seconds)
    await h.engine.tick()
    await h.engine.keeping_done()


async def _world_audit(h: Harness, run_id: int) -> list[tuple[str, Any]]:
    rows = await h.store.list_audit(f"run:{run_id}", 100, action="world")
    return [(r.action, r.detail) for r in rows]


def test_a_borrow_the_world_forgot_is_put_back_and_told(harness: Harness) -> None:
    harness.probe.dial = 1.5

    async def body() -> None:
        run = await harness.start(HOLDING)
        await _look(harness, 0)
        assert harness.probe.dial == 5
        harness.probe.dial = 1.5  # the server restarted: its configuration's value again
        await _look(harness, harness.engine.options.keep_interval or 0)
        assert harness.probe.dial == 5
        assert await _world_audit(harness, run.id) == [
            ("world.reapplied", {"ref": "probe.dial", "value": 5, "found": 1.5})
        ]
        await _look(harness, harness.engine.options.keep_interval or 0)  # nothing more to do
        assert len(await _world_audit(harness, run.id)) == 1
        # Put back under a fence of its own, higher than the borrow's.
        assert [f for _, f in harness.probe.written] == sorted(f for _, f in harness.probe.written)

    harness.run(body)


def test_a_value_set_by_hand_during_the_run_is_left_alone_and_told_once(harness: Harness) -> None:
    harness.probe.dial = 1.5

    async def body() -> None:
        run = await harness.start(HOLDING)
        await _look(harness, 0)
        harness.probe.dial = 9  # a person set it
        for _ in range(3):
            await _look(harness, harness.engine.options.keep_interval or 0)
        assert harness.probe.dial == 9
        assert await _world_audit(harness, run.id) == [
            ("world.left_alone", {"ref": "probe.dial", "value": 5, "found": 9})
        ]
        # The cleanup still leaves it alone, as it would have.
        await harness.engine.cancel_run(run.id)
        [run] = await harness.settle(run)
        assert harness.probe.dial == 9

    harness.run(body)


def test_what_a_restarted_module_lost_is_told(harness: Harness) -> None:
    async def body() -> None:
        run = await harness.start(SPAWNING)
        await _look(harness, 0)
        made = [r.ref for r in await harness.store.list_resources(run.id, live_only=True) if r.kind == "creature"]
        assert len(made) == 3
        for serial in made[:2]:
            assert harness.world.destroy(serial)  # gone with the restart
        # The module's process started again, a moment later, and said so.
        harness.clock.advance(1)
        await QueueStore(harness.store).announce("sandbox", {"module": "sandbox"}, harness.clock.now())
        await _look(harness, 5)  # its borrows are looked at, its world not yet: it is loading
        assert await _world_audit(harness, run.id) == []
        await _look(harness, LOST_GRACE)
        [(action, detail)] = await _world_audit(harness, run.id)
        assert action == "world.lost"
        assert detail["lost"] == {"creature": 2}
        assert sorted(detail["refs"]) == sorted(made[:2])
        await _look(harness, 5)  # told once per announce
        assert len(await _world_audit(harness, run.id)) == 1

    harness.run(body)


RETRIED = """
id: retried
cleanup: auto
phases:
  - name: setup
    steps:
      - action: core.lease
        name: borrow
        with: {lease: probe.dial, value: 5}
        retry: {attempts: 3, backoff: 1s}
"""


def test_a_borrow_retried_after_a_hand_edit_leaves_the_hand_value_alone(harness: Harness) -> None:
    """The first attempt writes the borrow and loses its answer; staff then set the value by
    hand. The retry compares before it writes again: it leaves the hand value alone and says
    so, and so does the cleanup. (Before, the retry wrote 5 over it without reading, and the
    cleanup then gave back 1.5: the hand value was lost without a word. Found by the
    simulation, seeds 7 and 88.)"""
    harness.probe.dial = 1.5
    writes = {"n": 0}

    async def first_write_loses_its_answer(call: Any, value: Any) -> None:
        writes["n"] += 1
        if writes["n"] == 1:
            harness.probe.dial = 9  # meanwhile, a person set it
            raise AnswerLost("probe: the answer went missing after the write")

    harness.probe.observe_dial = first_write_loses_its_answer

    async def body() -> None:
        run = await harness.start(RETRIED)
        [run] = await harness.settle(run)
        step = await harness.step(run, "borrow")
        assert (run.status, step.status, step.attempts) == ("succeeded", "succeeded", 2)
        assert step.output is not None
        assert step.output["left_alone"] == 9
        assert writes["n"] == 1, "the retry wrote nothing"
        assert harness.probe.dial == 9
        assert run.cleanup_status == "complete"

    harness.run(body)


def test_a_look_under_way_is_stopped_with_the_engine_and_holds_no_connection(harness: Harness) -> None:
    """The look at running runs' setups is a task beside the drain. Closing the engine
    left it running, holding a database connection in a transaction, which the garbage
    collector found later (a warning, and a suite's test failed for it)."""
    harness.probe.dial = 1.5

    async def body() -> None:
        await harness.start(HOLDING)
        await _look(harness, 0)
        harness.probe.dial = 1.5  # the server restarted
        reading = asyncio.Event()
        held = asyncio.Event()  # never set: the module does not answer

        async def hold(_call: object) -> None:
            reading.set()
            await held.wait()

        harness.probe.observe_dial_read = hold
        harness.clock.advance(harness.engine.options.keep_interval or 0)
        await harness.engine.tick()
        await asyncio.wait_for(reading.wait(), 10)
        await harness.engine.close()
        await asyncio.wait_for(harness.engine.keeping_done(), 10)
        assert harness.store.engine.pool.checkedout() == 0

    harness.run(body)

"""Layered leases: a lease that stacks (`sandbox.motd`) is borrowed by several runs at once,
each a layer with a priority. The world shows the top layer; a run that ends pops its own
layer wherever it sits; the value from before the first layer comes back when the last
goes; a value someone set by hand is not overwritten; an exclusive lease is still refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tests.conftest import Harness

from roadie.errors import DefinitionError
from roadie.states import LAYER_KIND


def banner(event_id: str, text: str, priority: int | None, *, hold: str | None = None) -> str:
    extra = f", priority: {priority}" if priority is not None else ""
    extra += f", for: {hold}" if hold else ""
    return f"""
id: {event_id}
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: banner
        with: {{lease: sandbox.motd, value: "{text}"{extra}}}
"""


def motd(harness: Harness) -> str:
    return str(harness.world.read_setting("motd"))


async def _started(harness: Harness, event_id: str, text: str, priority: int | None, **kw: str) -> int:
    run = await harness.start(banner(event_id, text, priority, **kw))
    [ended] = await harness.settle(run)
    assert ended.status == "succeeded", ended.error
    return run.id


def test_the_world_shows_the_top_layer_and_each_run_pops_its_own_wherever_it_sits(harness: Harness) -> None:
    async def body() -> None:
        harness.world.set_setting("motd", "welcome")
        weekend = await _started(harness, "weekend", "double xp weekend", 10)
        assert motd(harness) == "double xp weekend"
        hour = await _started(harness, "hour", "happy hour", 20)
        assert motd(harness) == "happy hour"
        low = await _started(harness, "low", "fishing contest", 0)
        assert motd(harness) == "happy hour"  # under the top: the world is not written

        report = await harness.engine.clean_up(low)  # from the bottom: nothing changes
        assert (report.status, report.verdict, report.restored) == ("complete", "verified_clean", 1)
        assert motd(harness) == "happy hour"
        report = await harness.engine.clean_up(hour)  # the top: the next one shows
        assert (report.status, report.verdict) == ("complete", "verified_clean")
        assert motd(harness) == "double xp weekend"
        report = await harness.engine.clean_up(weekend)  # the last: the value from before
        assert (report.status, report.verdict) == ("complete", "verified_clean")
        assert motd(harness) == "welcome"

        # The stack starts again from what the world shows now.
        harness.world.set_setting("motd", "maintenance tonight")
        again = await _started(harness, "again", "treasure hunt", None)
        assert motd(harness) == "treasure hunt"
        await harness.engine.clean_up(again)
        assert motd(harness) == "maintenance tonight"

    harness.run(body)


def test_a_tie_goes_to_the_later_borrow_and_the_layers_show_in_leases_in_force(harness: Harness) -> None:
    async def body() -> None:
        first = await _started(harness, "first", "one", 5)
        second = await _started(harness, "second", "two", 5)
        assert motd(harness) == "two"
        rows = [r for r in await harness.store.leases_in_force() if r.kind == LAYER_KIND]
        assert sorted((r.run_id, r.payload["priority"], r.payload["value"]) for r in rows) == [
            (first, 5, "one"),
            (second, 5, "two"),
        ]
        await harness.engine.clean_up(second)
        assert motd(harness) == "one"
        await harness.engine.clean_up(first)
        assert motd(harness) == ""

    harness.run(body)


def test_a_value_set_by_hand_is_left_alone_and_reported(harness: Harness) -> None:
    async def body() -> None:
        low = await _started(harness, "low", "fishing contest", 1)
        top = await _started(harness, "top", "invasion!", 9)
        harness.world.set_setting("motd", "server restarting in 5 minutes")  # a person
        report = await harness.engine.clean_up(top)
        assert report.left_alone == 1
        # Not the run's to take back, and not the world from before the run either.
        assert (report.status, report.verdict) == ("complete", "unverified")
        [finding] = report.verification["findings"]
        assert (finding["finding"], finding["kind"], finding["ref"]) == ("changed", "@layer", "sandbox.motd")
        assert motd(harness) == "server restarting in 5 minutes"
        report = await harness.engine.clean_up(low)
        assert report.left_alone == 1
        assert motd(harness) == "server restarting in 5 minutes"

    harness.run(body)


def test_a_pop_lost_by_the_world_is_found_and_popped_again(harness: Harness, tmp_path: Path) -> None:
    """The world loses the write that showed the next layer (it crashed before saving): the
    read-back in the same round finds the popped layer's value still shown and pops again."""

    async def body() -> None:
        weekend = await _started(harness, "weekend", "double xp weekend", 10)
        hour = await _started(harness, "hour", "happy hour", 20)
        harness.world.lose_reverts_next(1, action="motd.write")
        report = await harness.engine.clean_up(hour)
        assert (report.status, report.verdict) == ("rolled_back", "partially_rolled_back")
        assert (report.verification["still_there"], report.restored) == (1, 2)  # popped again, in the same round
        assert motd(harness) == "double xp weekend"
        [proved] = await harness.settle(hour)  # the workers prove it
        assert proved.cleanup_report is not None
        assert (proved.cleanup_status, proved.cleanup_report["verdict"]) == ("complete", "verified_clean")
        await harness.engine.clean_up(weekend)
        assert motd(harness) == ""

        # A world rolled back after a finished cleanup: the next round finds the layer's
        # value back and pops it again.
        copy = tmp_path / "saved.db"
        third = await _started(harness, "third", "treasure hunt", 3)
        with sqlite3.connect(copy) as target:
            harness.world._db.backup(target)
        assert (await harness.engine.clean_up(third)).verdict == "verified_clean"
        with sqlite3.connect(copy) as saved:
            saved.backup(harness.world._db)
        assert motd(harness) == "treasure hunt"
        report = await harness.engine.clean_up(third, again=True)
        assert (report.status, report.verdict) == ("rolled_back", "partially_rolled_back")
        assert motd(harness) == ""

    harness.run(body)


def test_a_pop_that_failed_half_way_keeps_the_value_from_before(harness: Harness) -> None:
    """A pop whose world write fails leaves its layer out and the world showing it: a new
    run's borrow then must not take that value for the one to give back at the end."""

    async def body() -> None:
        harness.world.set_setting("motd", "welcome")
        first = await _started(harness, "first", "market day", 4)
        harness.world.fail_next(1, action="motd.write")
        report = await harness.engine.clean_up(first)
        assert (report.status, report.failed) == ("incomplete", 1)
        assert motd(harness) == "market day"  # the failed write
        second = await _started(harness, "second", "tournament", 1)
        assert motd(harness) == "tournament"
        assert (await harness.engine.clean_up(second)).verdict == "verified_clean"
        assert motd(harness) == "welcome"
        report = await harness.engine.clean_up(first, again=True)
        assert (report.status, report.verdict) == ("complete", "verified_clean")
        assert motd(harness) == "welcome"

    harness.run(body)


def test_an_expired_layer_is_popped_while_its_run_goes_on(harness: Harness) -> None:
    async def body() -> None:
        await _started(harness, "weekend", "double xp weekend", 10)
        await _started(harness, "hour", "happy hour", 20, hold="1h")
        assert motd(harness) == "happy hour"
        harness.clock.advance(3601)
        await harness.settle()
        assert motd(harness) == "double xp weekend"

    harness.run(body)


def test_a_priority_for_a_lease_that_does_not_stack_is_refused_before_a_run_exists(harness: Harness) -> None:
    async def body() -> None:
        text = banner("x", "x", 3).replace("lease: sandbox.motd", "lease: sandbox.xp_rate").replace('"x"', "2.0")
        with pytest.raises(DefinitionError, match=r"lease sandbox\.xp_rate does not stack"):
            await harness.start(text)
        assert await harness.store.list_runs() == []

    harness.run(body)


def test_a_lease_whose_module_changed_its_mind_is_not_held_both_ways(harness: Harness) -> None:
    """A module upgraded between two runs says `sandbox.motd` no longer stacks (or now
    does): a borrow of the other kind is refused while the target is held the first way,
    naming the run that holds it. (Pre-flight would refuse both starts: they are forced,
    for the ledger's own refusal at dispatch is what this proves.)"""
    lease = harness.registry.lease("sandbox.motd")

    async def body() -> None:
        layered = await _started(harness, "layered", "market day", 2)
        lease.stacks = False
        try:
            run = await harness.start(banner("alone", "exclusive", None), force=True)
            [ended] = await harness.settle(run)
            assert ended.status == "failed"
            assert f"sandbox.motd is stacked by run {layered}" in (ended.error or "")
            assert motd(harness) == "market day"
            await harness.engine.clean_up(layered)
            assert motd(harness) == ""
            alone = await _started(harness, "alone2", "exclusive", None)
        finally:
            lease.stacks = True
        run = await harness.start(banner("late-layer", "too late", 5), force=True)
        [ended] = await harness.settle(run)
        assert ended.status == "failed"
        assert f"already held by run {alone}" in (ended.error or "")
        assert motd(harness) == "exclusive"
        await harness.engine.clean_up(alone)
        assert motd(harness) == ""

    harness.run(body)


def test_a_layer_pushed_over_a_value_set_by_hand_leaves_it_alone_and_says_so(harness: Harness) -> None:
    """Issue 37: with a weekend layer (priority 10) in place, the motd is set by hand to
    `MAINT-E`; a happy hour (priority 20) is pushed. It used to overwrite the hand value
    without a word. Compare-before-write: the hour's layer goes in, the world is left
    alone and the step says so; each cleanup leaves it alone too."""

    async def body() -> None:
        harness.world.set_setting("motd", "welcome")
        weekend = await _started(harness, "weekend", "Double XP all weekend!", 10)
        harness.world.set_setting("motd", "MAINT-E")  # a person
        hour = await _started(harness, "hour", "Happy hour: triple XP!", 20)
        assert motd(harness) == "MAINT-E"
        step = await harness.step(hour, "banner")
        assert step.output is not None
        assert (step.output["left_alone"], step.output["shown"]) == ("MAINT-E", "MAINT-E")
        report = await harness.engine.clean_up(hour)
        assert (report.left_alone, report.verdict) == (1, "unverified")
        assert motd(harness) == "MAINT-E"
        report = await harness.engine.clean_up(weekend)
        assert (report.left_alone, report.status) == (1, "complete")
        assert motd(harness) == "MAINT-E"

    harness.run(body)

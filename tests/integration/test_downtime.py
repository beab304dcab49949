"""Guaranteed teardown after downtime: when every worker was down as a run's end or a
lease's `until` passed, the first worker back gives the lease back, ends the run and
cleans it up before it starts anything new, and the report says how late each came."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from tests.conftest import Harness

NIGHT = """
id: night-storm
cleanup: auto
duration: 1h
phases:
  - name: dusk
    steps:
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: britain, value: storm, for: 10m}
      - action: core.lease
        name: double xp
        with: {lease: sandbox.xp_rate, value: 2.0}
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
"""

PATROL = """
id: patrol
cleanup: manual
phases:
  - name: go
    steps:
      - action: sandbox.spawn
        name: guards
        with: {kind: guard, region: yew, count: 2}
"""


def test_the_first_worker_back_tears_down_what_fell_due_before_anything_new(harness: Harness) -> None:
    async def body() -> None:
        before = harness.world.snapshot()
        night = await harness.start(NIGHT)
        while any(s.status != "succeeded" for s in await harness.store.list_steps(night.id)) or not (
            await harness.store.list_steps(night.id)
        ):
            await harness.engine.tick()
        assert harness.world.read_weather("britain") == "storm"
        # Every worker goes down. A run is started meanwhile, and two hours pass: the
        # storm's ten minutes and the night's hour both end with nobody to see them.
        patrol = await harness.start(PATROL)
        harness.clock.advance(timedelta(hours=2).total_seconds())
        await harness.restart()

        worker = asyncio.create_task(harness.engine.run_forever())

        async def patrol_done() -> None:
            while (await harness.store.get_run(patrol.id)).status != "succeeded":
                await asyncio.sleep(0.01)

        await harness.drive(patrol_done())
        harness.engine.stop()
        await harness.drive(worker)

        ended = await harness.store.get_run(night.id)
        assert (ended.status, ended.cleanup_status) == ("succeeded", "complete")
        assert ended.cleanup_report is not None
        assert ended.cleanup_report["verdict"] == "verified_clean"
        late = {e["what"]: e["late_s"] for e in ended.cleanup_report["late"]}
        assert late["run end"] >= 3600 - 60  # due an hour in; ended two hours in
        assert late["lease sandbox.weather#britain"] >= 6600 - 60  # due ten minutes in
        # Nothing new touched the world before the night's teardown was done: every
        # removal of the night's orcs comes before the first guard.
        effects = harness.world.effects()
        guards = [e["id"] for e in effects if e["op"] == "create" and e["key"].split("-")[1] == str(patrol.id)]
        removals = [e["id"] for e in effects if e["op"] == "remove"]
        restores = [e["id"] for e in effects if e["op"] == "set"][2:]  # after the two borrows
        assert len(guards) == 2
        assert len(removals) == 3
        assert len(restores) == 2
        assert max(removals + restores) < min(guards)
        after = harness.world.snapshot()
        assert after["regions"] == before["regions"]
        assert after["settings"] == before["settings"]
        assert sorted(c["kind"] for c in after["creatures"].values()) == ["guard", "guard"]

    harness.run(body)

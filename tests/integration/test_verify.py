"""Proof of undo (DESIGN §12): every cleanup reads the world back and ends with a verdict.
What a world brought back after its own rollback is reverted again and proved gone by the
next round; what a reused id now names is left alone; a setting someone changed since is
not overwritten; a module that cannot inspect makes the verdict `unverified`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.conftest import Harness

from roadie.states import AUTO_CLEANUP_ROUNDS, OVERRIDE_KIND

ORCS = """
id: verify
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: britain, value: storm}
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
"""


def _save(harness: Harness, tmp_path: Path) -> Path:
    """The world's last save: its file as it is now."""
    copy = tmp_path / "world-saved.db"
    with sqlite3.connect(copy) as target:
        harness.world._db.backup(target)
    return copy


def _roll_back(harness: Harness, copy: Path) -> None:
    """Put the world file back as it was at its last save, as a server that crashed before
    saving what cleanup did comes back."""
    with sqlite3.connect(copy) as saved:
        saved.backup(harness.world._db)


def test_a_cleanup_ends_verified_clean(harness: Harness) -> None:
    async def body() -> None:
        before = harness.world.snapshot()
        run = await harness.start(ORCS)
        await harness.settle(run)
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.verdict) == ("complete", "verified_clean")
        found = report.verification
        assert (found["inspected"], found["gone"], found["came_back"], found["findings"]) == (4, 4, 0, [])
        assert harness.world.snapshot() == before
        stored = await harness.store.get_run(run.id)
        assert stored.cleanup_report is not None
        assert stored.cleanup_report["verdict"] == "verified_clean"

    harness.run(body)


def test_a_world_rolled_back_after_cleanup_is_found_and_taken_down_again(harness: Harness, tmp_path: Path) -> None:
    """The world comes back from a save made before cleanup: the next round finds the orcs
    and the storm back, says *partially rolled back*, reverts them again, and the round
    after proves it: *verified clean*."""

    async def body() -> None:
        before = harness.world.snapshot()
        run = await harness.start(ORCS)
        await harness.settle(run)
        copy = _save(harness, tmp_path)
        assert (await harness.engine.clean_up(run.id)).verdict == "verified_clean"

        _roll_back(harness, copy)
        assert len(harness.world.snapshot()["creatures"]) == 3
        assert harness.world.read_weather("britain") == "storm"
        report = await harness.engine.clean_up(run.id, again=True)
        assert (report.status, report.verdict) == ("rolled_back", "partially_rolled_back")
        found = report.verification
        assert (found["came_back"], found["still_there"], found["gone"]) == (4, 0, 0)
        assert sorted(f["kind"] for f in found["findings"]) == ["creature"] * 3 + ["override"]
        assert (report.reverted, report.restored) == (3, 1)  # reverted again in the same round
        assert harness.world.snapshot() == before
        audit = await harness.store.list_audit(f"run:{run.id}", 1)
        assert audit[0].detail["verdict"] == "partially_rolled_back"

        [proved] = await harness.settle(run)  # the workers prove it, though cleanup is manual
        assert proved.cleanup_report is not None
        assert (proved.cleanup_status, proved.cleanup_report["verdict"]) == ("complete", "verified_clean")
        assert (proved.cleanup_report["calls"], proved.cleanup_report["verification"]["gone"]) == (0, 4)

    harness.run(body)


def test_a_rollback_under_a_finishing_cleanup_is_still_there_and_retried_by_the_worker(
    harness: Harness, tmp_path: Path
) -> None:
    """The world loses the orcs' revert after it answered (a crash before its next save),
    and the storm's restore too: reading back in the same round finds them *still there*,
    and they are reverted again. The workers' next round proves it: *verified clean*."""

    async def body() -> None:
        before = harness.world.snapshot()
        harness.world.lose_reverts_next(1)
        harness.world.lose_reverts_next(1, action="weather.write")
        run = await harness.start(ORCS.replace("cleanup: manual", "cleanup: auto"))
        [ended] = await harness.settle(run)
        assert (ended.cleanup_status, ended.cleanup_attempts) == ("complete", 2)
        assert ended.cleanup_report is not None
        assert ended.cleanup_report["verdict"] == "verified_clean"
        assert harness.world.snapshot() == before
        first, proof = reversed(
            [a.detail for a in await harness.store.list_audit(f"run:{run.id}", 10) if a.action == "cleanup"]
        )
        assert (first["status"], first["verdict"]) == ("rolled_back", "partially_rolled_back")
        assert harness.world.faults_met["lose_revert"] == 2
        assert (proof["status"], proof["verdict"]) == ("complete", "verified_clean")

    harness.run(body)


def test_a_reused_id_and_a_setting_changed_by_hand_are_left_alone(harness: Harness, tmp_path: Path) -> None:
    """After the rollback one orc's serial belongs to another key's object (the server
    reused it) and an admin has set the weather to fog: the two orcs that are the run's are
    reverted again; the horse and the fog stay."""

    async def body() -> None:
        run = await harness.start(ORCS)
        await harness.settle(run)
        serials = sorted(harness.world.snapshot()["creatures"])
        copy = _save(harness, tmp_path)
        await harness.engine.clean_up(run.id)
        _roll_back(harness, copy)
        harness.world.reuse_serial(serials[0], "horse", "britain", tag="someone-else")
        harness.world.set_weather("britain", "fog")

        report = await harness.engine.clean_up(run.id, again=True)
        found = report.verification
        assert (found["came_back"], found["foreign"], found["changed"]) == (2, 1, 1)
        assert report.verdict == "partially_rolled_back"
        assert harness.world.snapshot()["creatures"] == {serials[0]: {"kind": "horse", "region": "britain"}}
        assert harness.world.read_weather("britain") == "fog"
        # The orcs are gone; the weather shows neither its saved value nor the run's: the
        # world is not proved what it was, and the fog is named.
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.verdict) == ("complete", "unverified")
        assert [f["finding"] for f in report.verification["findings"]] == ["changed"]

    harness.run(body)


def test_a_setting_changed_by_hand_during_the_event_is_not_written_over(harness: Harness) -> None:
    """An admin sets the weather to fog while the run holds its storm: cleanup gives back
    nothing over the fog (it restores only over the value it wrote) and says so, and the
    expiry sweeper does the same for a lease with `for:`."""

    async def body() -> None:
        run = await harness.start(ORCS)
        await harness.settle(run)
        harness.world.set_weather("britain", "fog")
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.restored, report.left_alone) == ("complete", 0, 1)
        assert harness.world.read_weather("britain") == "fog"
        found = report.verification
        assert (found["changed"], report.verdict) == (1, "unverified")
        assert [f["finding"] for f in found["findings"]] == ["changed"]
        assert await harness.store.leases_in_force() == []  # the target is free again

        timed = await harness.start(
            ORCS.replace("id: verify", "id: timed").replace("value: storm}", "value: hail, for: 1m}")
        )
        while harness.world.read_weather("britain") != "hail":
            await harness.engine.tick()
        harness.world.set_weather("britain", "snow")
        harness.clock.advance(61)
        await harness.engine.tick()  # the sweeper's turn
        assert harness.world.read_weather("britain") == "snow"
        assert await harness.store.leases_in_force() == []
        assert (await harness.engine.clean_up(timed.id)).verification["changed"] == 1

    harness.run(body)


def test_a_setting_another_run_holds_now_is_not_taken(harness: Harness, tmp_path: Path) -> None:
    """The storm came back, but another run has borrowed the weather since and set it to
    storm too: the target is that run's, and this run's row stays reverted."""

    async def body() -> None:
        run = await harness.start(ORCS)
        await harness.settle(run)
        copy = _save(harness, tmp_path)
        await harness.engine.clean_up(run.id)
        _roll_back(harness, copy)
        other = await harness.start(ORCS.replace("id: verify", "id: verify-again").replace("count: 3", "count: 1"))
        await harness.settle(other)

        report = await harness.engine.clean_up(run.id, again=True)
        found = report.verification
        assert (found["came_back"], found["foreign"]) == (3, 1)
        assert harness.world.read_weather("britain") == "storm"  # the other run's storm
        leases = await harness.store.leases_in_force()
        assert [(r.run_id, r.ref) for r in leases] == [(other.id, "sandbox.weather#britain")]

    harness.run(body)


def test_a_module_that_cannot_inspect_is_unverified(harness: Harness) -> None:
    """The probe module answers no inspect: its resources make the verdict `unverified`,
    and the run's cleanup is complete all the same."""

    async def body() -> None:
        text = """
id: probe-verify
cleanup: manual
phases:
  - name: only
    steps:
      - action: probe.make
        with: {answer: [{kind: thing, ref: t1}]}
"""
        run = await harness.start(text)
        await harness.settle(run)
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.verdict) == ("complete", "unverified")
        found = report.verification
        assert (found["unverifiable"], found["modules_without_inspect"]) == (1, ["probe"])

    harness.run(body)


def test_a_world_that_keeps_coming_back_stops_being_retried(harness: Harness, tmp_path: Path) -> None:
    """A world that loses every revert is retried by the workers for AUTO_CLEANUP_ROUNDS
    rounds in all, then left `rolled_back` for a human, and the run counts as settled."""

    async def body() -> None:
        harness.world.lose_reverts_next(1000)
        run = await harness.start(ORCS.replace("cleanup: manual", "cleanup: auto"))
        [ended] = await harness.settle(run)
        assert (ended.cleanup_status, ended.cleanup_attempts) == ("rolled_back", AUTO_CLEANUP_ROUNDS)
        assert ended.cleanup_report is not None
        assert ended.cleanup_report["verification"]["came_back"] == 3  # the last redo was lost too
        assert await harness.store.runs_due_cleanup(harness.clock.now()) == []
        harness.world.clear_faults()
        report = await harness.engine.clean_up(run.id, again=True)  # a human's retry, as `roadie cleanup` makes it
        assert report.verdict == "partially_rolled_back"  # the last redo was lost: the orcs are there
        [proved] = await harness.settle(run)  # the workers prove this redo
        assert proved.cleanup_report is not None
        assert (proved.cleanup_status, proved.cleanup_report["verdict"]) == ("complete", "verified_clean")

    harness.run(body)


def test_a_cleanup_left_incomplete_is_never_verified_clean(harness: Harness) -> None:
    """Two orcs' revert fails, the storm and the other step's orcs are taken back: the
    cleanup ends `incomplete`, and the orcs still in the world make the verdict *partially
    rolled back*, not *verified clean* over what was read back (CI saw `incomplete, 2
    failed` told as `verified clean: 5 read back, 5 gone`)."""

    async def body() -> None:
        text = ORCS.replace(
            "count: 3}",
            "count: 3}\n      - {action: sandbox.spawn, name: pair, with: {kind: orc, region: britain, count: 2}}",
        )
        run = await harness.start(text)
        await harness.settle(run)
        harness.world.fail_reverts_next(1)  # the newest step's revert: the pair
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.failed, report.verification["gone"]) == ("incomplete", 2, 4)
        assert report.verdict == "partially_rolled_back"
        stored = (await harness.get_run(run)).cleanup_report
        assert stored is not None
        assert (stored["status"], stored["verdict"], stored["verification"]["verdict"]) == (
            "incomplete",
            "partially_rolled_back",
            "partially_rolled_back",
        )
        report = await harness.engine.clean_up(run.id, again=True)
        assert (report.status, report.verdict) == ("complete", "verified_clean")

    harness.run(body)


def test_a_cleanup_left_pending_is_never_verified_clean(harness: Harness) -> None:
    """The expiry sweeper holds the storm's row when the cleanup comes to it: the orcs are
    gone, but the storm is not given back yet and the cleanup stays `pending`: its verdict
    is *partially rolled back*, not *verified clean*."""

    async def body() -> None:
        run = await harness.start(ORCS.replace("value: storm}", "value: storm, for: 10s}"))
        await harness.settle(run)
        harness.clock.advance(11)
        [row] = [r for r in await harness.store.list_resources(run.id, live_only=True) if r.kind == OVERRIDE_KIND]
        assert await harness.store.claim_expired_lease(row.id, "sweeper", harness.clock.now(), 60.0)
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.held, report.verification["gone"]) == ("pending", 1, 3)
        assert report.verdict == "partially_rolled_back"
        stored = (await harness.get_run(run)).cleanup_report
        assert stored is not None
        assert (stored["status"], stored["verdict"]) == ("pending", "partially_rolled_back")

    harness.run(body)

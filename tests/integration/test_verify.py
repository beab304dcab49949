"""`cleanup --verify`: what a world brought back after its own rollback is found and reverted
again; what a reused id now names is left alone (DESIGN §6, Verify)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.conftest import Harness

ORCS = """
id: verify
cleanup: manual
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
"""


def _rollback(harness: Harness, copy: Path) -> None:
    """Put the world file back as it was when `copy` was taken, as a server that lost its
    last saves would."""
    with sqlite3.connect(copy) as saved:
        saved.backup(harness.world._db)


def _save(harness: Harness, tmp_path: Path) -> Path:
    copy = tmp_path / "world-before-cleanup.db"
    with sqlite3.connect(copy) as target:
        harness.world._db.backup(target)
    return copy


def test_verify_finds_and_reverts_what_came_back(harness: Harness, tmp_path: Path) -> None:
    async def body() -> None:
        before = harness.world.snapshot()
        run = await harness.start(ORCS)
        await harness.settle(run)
        assert len(harness.world.snapshot()["creatures"]) == 3
        copy = _save(harness, tmp_path)
        report = await harness.engine.clean_up(run.id)
        assert report.status == "complete"
        assert harness.world.snapshot() == before

        _rollback(harness, copy)
        assert len(harness.world.snapshot()["creatures"]) == 3  # the orcs came back
        verified = await harness.engine.cleanup.verify(run.id, actor="test")
        assert (verified.verified, verified.came_back, verified.redone, verified.failed) == (3, 3, 3, 0)
        assert harness.world.snapshot() == before
        stored = (await harness.store.get_run(run.id)).cleanup_report
        assert stored is not None
        assert stored["verify"]["redone"] == 3

        again = await harness.engine.cleanup.verify(run.id)
        assert (again.verified, again.came_back, again.redone) == (3, 0, 0)

    harness.run(body)


def test_verify_leaves_a_reused_id_alone(harness: Harness, tmp_path: Path) -> None:
    """After the rollback one orc's serial belongs to another key's object (the server
    reused it): verify reverts the two that are the run's, and not that one."""

    async def body() -> None:
        run = await harness.start(ORCS)
        await harness.settle(run)
        serials = sorted(harness.world.snapshot()["creatures"])
        copy = _save(harness, tmp_path)
        await harness.engine.clean_up(run.id)
        _rollback(harness, copy)
        harness.world.reuse_serial(serials[0], "horse", "britain", tag="someone-else")

        verified = await harness.engine.cleanup.verify(run.id)
        assert (verified.came_back, verified.redone, verified.foreign) == (2, 2, 1)
        assert harness.world.snapshot()["creatures"] == {serials[0]: {"kind": "horse", "region": "britain"}}

    harness.run(body)


def test_verify_says_what_it_cannot_inspect(harness: Harness) -> None:
    """The probe module answers no inspect: its resources are counted as unverifiable."""

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
        await harness.engine.clean_up(run.id)
        verified = await harness.engine.cleanup.verify(run.id)
        assert (verified.verified, verified.unverifiable, verified.modules_without_inspect) == (0, 1, ["probe"])

    harness.run(body)

"""Teardown preview with caps: a module with more to revert than its cap holds the
cleanup for a person, who reads the preview and confirms; the confirmation is audited."""

from __future__ import annotations

import re

import pytest
from tests.conftest import Harness

from roadie.config import Settings
from roadie.errors import ConfigError
from roadie.runtime import engine_options

HORDE = """
id: horde
cleanup: auto
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


def test_a_cleanup_over_a_modules_cap_waits_for_a_confirm(harness: Harness) -> None:
    harness.options.cleanup_caps = {"sandbox": 2}

    async def body() -> None:
        before = harness.world.snapshot()
        run = await harness.start(HORDE)
        [ended] = await harness.settle(run)  # held is settled: no worker takes it up again
        assert ended.cleanup_status == "held"
        assert ended.cleanup_report is not None
        assert ended.cleanup_report["over_cap"] == {"sandbox": {"count": 3, "cap": 2}}
        assert len(harness.world.snapshot()["creatures"]) == 3  # nothing was reverted
        assert harness.world.read_weather("britain") == "storm"
        assert await harness.store.runs_due_cleanup(harness.clock.now()) == []

        preview = {(g.module, g.kind): g for g in await harness.engine.cleanup.preview(run.id)}
        orcs = preview["sandbox", "creature"]
        assert (orcs.count, orcs.cap, orcs.over_cap, len(orcs.newest)) == (3, 2, True, 3)
        assert orcs.newest[0].startswith("orc in britain (creature ")
        storm = preview["core", "override"]
        assert (storm.count, storm.cap, storm.over_cap) == (1, None, False)
        assert storm.newest == ["sandbox.weather#britain, back to 'clear'"]

        report = await harness.engine.clean_up(run.id, actor="mira", again=True, confirm=True)
        assert (report.status, report.reverted, report.restored) == ("complete", 3, 1)
        assert harness.world.snapshot() == before
        audit = [(a.actor, a.action, a.detail) for a in await harness.store.list_audit(f"run:{run.id}", 10)]
        assert ("mira", "cleanup.confirm", {"over_cap": {"sandbox": {"count": 3, "cap": 2}}}) in audit
        assert [a[1] for a in audit if a[1].startswith("cleanup")][-1] == "cleanup"  # the held one, first

    harness.run(body)


def test_a_cleanup_within_the_cap_and_a_default_cap(harness: Harness) -> None:
    """The default cap counts each module on its own: three orcs and one storm under a cap
    of 3 go ahead unconfirmed, and a member's cleanup counts only that member's rows."""
    harness.options.cleanup_cap = 3

    async def body() -> None:
        run = await harness.start(HORDE.replace("cleanup: auto", "cleanup: manual"))
        await harness.settle(run)
        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.over_cap) == ("complete", {})

    harness.run(body)


@pytest.mark.parametrize(
    ("engine", "problem"),
    [
        ({"cleanup_cap": "lots"}, "roadie.toml: engine.cleanup_cap: Input should be a valid integer, not 'lots'"),
        ({"cleanup_cap": -1}, "engine.cleanup_cap: Input should be greater than or equal to 0, not -1"),
        ({"cleanup_caps": {"sandbox": 2.5}}, "engine.cleanup_caps.sandbox: Input should be a valid integer, not 2.5"),
        ({"cleanup_caps": 5}, "engine.cleanup_caps: Input should be a valid dictionary, not 5"),
        ({"sweep_interval": "often"}, "engine.sweep_interval: Input should be a valid number, not 'often'"),
    ],
)
def test_a_bad_cap_or_interval_is_refused_with_its_name(engine: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        engine_options(Settings(engine=engine, source="roadie.toml"))

"""A cleanup's verdict never contradicts its status (DESIGN §12).

Random cleanup outcomes over the sandbox world: some steps' reverts fail, some are lost
by the world (the objects stay), a borrowed weather is set by hand meanwhile or held by
the expiry sweeper when the cleanup comes to it. Whatever happened, *verified clean* is
said only of a cleanup that is `complete` with nothing live and nothing left alone; a
cleanup that ends `incomplete`, `pending` or `rolled_back` says *partially rolled back*;
every value left alone is named in the verdict; and the report kept in the database says
what the engine answered.

`ROADIE_VERDICT_EXAMPLES` sets how many random outcomes each database tries (default 15).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import Harness

from roadie.states import OVERRIDE_KIND

EXAMPLES = int(os.environ.get("ROADIE_VERDICT_EXAMPLES", "15"))


@dataclass(frozen=True)
class Outcome:
    """What happens to one run's cleanup."""

    counts: tuple[int, ...]  # one spawn step per entry, of that many orcs
    failing: int  # revert calls that fail (newest step first)
    lost: int  # revert calls the world loses after answering
    by_hand: bool  # the weather is set by hand while the run holds it
    swept: bool  # the expiry sweeper holds the weather's row when the cleanup comes


outcomes = st.builds(
    Outcome,
    counts=st.lists(st.integers(1, 2), min_size=1, max_size=3).map(tuple),
    failing=st.integers(0, 3),
    lost=st.integers(0, 3),
    by_hand=st.booleans(),
    swept=st.booleans(),
)


def _event(region: str, outcome: Outcome) -> str:
    hold = ", for: 10s" if outcome.swept else ""
    spawns = "".join(
        f"""
      - action: sandbox.spawn
        name: orcs{i}
        with: {{kind: orc, region: {region}, count: {count}}}"""
        for i, count in enumerate(outcome.counts)
    )
    return f"""
id: verdict-{region}
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: weather
        with: {{lease: sandbox.weather, target: {region}, value: storm{hold}}}{spawns}
"""


def test_the_verdict_never_contradicts_the_status(harness: Harness) -> None:
    regions = (f"r{n}" for n in itertools.count())

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(outcomes)
    def check(outcome: Outcome) -> None:
        region = next(regions)  # a region of its own: no example holds another's target
        harness.world.add_region(region)

        async def body() -> None:
            harness.world.clear_faults()
            run = await harness.start(_event(region, outcome))
            [ended] = await harness.settle(run)
            assert ended.status == "succeeded", ended.error
            if outcome.by_hand:
                harness.world.set_weather(region, "fog")
            if outcome.swept:
                harness.clock.advance(11)
                [row] = [
                    r for r in await harness.store.list_resources(run.id, live_only=True) if r.kind == OVERRIDE_KIND
                ]
                assert await harness.store.claim_expired_lease(row.id, "sweeper", harness.clock.now(), 3600.0)
            harness.world.fail_reverts_next(outcome.failing)
            harness.world.lose_reverts_next(outcome.lost)
            report = await harness.engine.clean_up(run.id)
            live = await harness.store.list_resources(run.id, live_only=True)

            if report.verdict == "verified_clean":
                assert (report.status, report.left_alone, live) == ("complete", 0, []), report
            if report.status in ("incomplete", "pending", "rolled_back"):
                assert report.verdict == "partially_rolled_back", report
            if report.left_alone:
                assert report.verdict != "verified_clean", report
                named = [f for f in report.verification["findings"] if f["finding"] == "changed"]
                assert len(named) >= report.left_alone, report
            assert report.verification["verdict"] == report.verdict
            stored = (await harness.get_run(run)).cleanup_report
            assert stored is not None
            assert (stored["status"], stored["verdict"], stored["verification"]["verdict"]) == (
                report.status,
                report.verdict,
                report.verdict,
            )

        harness.run(body)

    check()

"""The orphan sweep: what the world holds tagged with a Roadie key, that no live ledger row
names and whose run has ended, is taken down, by its key's own action and tag check;
a run in flight, a row still live and a key that is not ours are left alone."""

from __future__ import annotations

from tests.conftest import Harness

BOSS = """
id: boss
cleanup: manual
duration: 10m
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        name: warlord
        with: {kind: orc warlord, region: britain, count: 1}
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
"""


def test_summons_of_an_ended_run_are_swept_and_nothing_else(harness: Harness) -> None:
    harness.options.sweep_interval = None  # this test sweeps by hand, as `roadie sweep` does

    async def body() -> None:
        before = harness.world.snapshot()
        run = await harness.start(BOSS)
        while (await harness.store.get_run(run.id)).ends_at is None:
            await harness.engine.tick()
        [warlord] = [s for s, c in harness.world.snapshot()["creatures"].items() if c["kind"] == "orc warlord"]
        minions = harness.world.summon(warlord, "orc minion", 2)  # reported to no one
        harness.world.reuse_serial("0x7fff0001", "deer", "yew", tag="not-a-roadie-key")

        [held] = await harness.engine.sweeper.sweep()
        assert (held.listed, held.in_flight, held.orphans, held.unknown) == (7, 6, 0, 1)

        [ended] = await harness.settle(run)
        assert ended.status == "succeeded"
        plan = (await harness.engine.sweeper.sweep(plan=True))[0]
        # The run's cleanup is still to come (manual): its rows are live, only the summons
        # are named by none.
        assert (plan.orphans, plan.in_ledger, plan.reverted) == (2, 4, 0)
        assert sorted(f["ref"] for f in plan.found) == sorted(minions)
        assert len(harness.world.snapshot()["creatures"]) == 7  # a plan changes nothing

        report = await harness.engine.clean_up(run.id)
        assert (report.status, report.verdict) == ("complete", "verified_clean")  # the ledger's rows are gone
        assert sorted(harness.world.snapshot()["creatures"]) == sorted([*minions, "0x7fff0001"])
        [swept] = await harness.engine.sweeper.sweep(actor="mira")
        assert (swept.orphans, swept.reverted, swept.failed) == (2, 2, 0)
        assert harness.world.snapshot()["creatures"] == {"0x7fff0001": {"kind": "deer", "region": "yew"}}
        harness.world.destroy("0x7fff0001")
        assert harness.world.snapshot() == before
        [entry] = [a for a in await harness.store.list_audit("module:sandbox", 5) if a.action == "sweep"]
        assert (entry.actor, entry.detail["reverted"]) == ("mira", 2)
        [again] = await harness.engine.sweeper.sweep()
        assert again.orphans == 0

    harness.run(body)


def test_a_creature_killed_during_the_event_respawns_after_cleanup_and_the_worker_sweeps_it(
    harness: Harness,
) -> None:
    """Orcs respawn a minute after they die. A player kills one during the event; cleanup
    takes the rest down; a minute later the dead orc is back, tagged with the step's key,
    named by no row. The worker's periodic sweep takes it down again."""
    harness.options.sweep_interval = 300

    async def body() -> None:
        before = harness.world.snapshot()
        harness.world.respawn_after("orc", 60)
        run = await harness.start(
            BOSS.replace("duration: 10m", "duration: 30s").replace("cleanup: manual", "cleanup: auto")
        )
        while (await harness.store.get_run(run.id)).ends_at is None:
            await harness.engine.tick()
        killed = next(s for s, c in harness.world.snapshot()["creatures"].items() if c["kind"] == "orc")
        assert harness.world.destroy(killed)
        [ended] = await harness.settle(run)
        assert (ended.cleanup_status, ended.cleanup_report["verdict"]) == ("complete", "verified_clean")
        assert harness.world.snapshot()["creatures"] == {}

        harness.clock.advance(61)
        back = harness.world.snapshot()["creatures"]
        assert [c["kind"] for c in back.values()] == ["orc"]  # the respawn timer ran on
        for _ in range(20):
            harness.clock.advance(60)
            await harness.engine.tick()
            await harness.engine.sweeps_done()
            if not harness.world.snapshot()["creatures"]:
                break
        assert harness.world.snapshot() == before

    harness.run(body)


def test_a_foreign_key_sharing_a_steps_run_phase_and_seq_hides_no_orphan(harness: Harness) -> None:
    """Issue 37: keys are `nonce-run-phase-seq`. Another installation's object tagged with
    a key that shares this run's warlord step's (run, phase, seq) used to collapse with
    the warlord's own key in the lookup, so this run's orphans were counted "not ours".
    The sweep matches each object on its whole key: the summons are swept, the foreign
    object is left alone."""
    harness.options.sweep_interval = None

    async def body() -> None:
        run = await harness.start(BOSS.replace("duration: 10m", "duration: 0s"))
        [ended] = await harness.settle(run)
        assert ended.status == "succeeded"
        await harness.engine.clean_up(run.id)
        step = await harness.step(run, "warlord")
        nonce, rest = step.idempotency_key.split("-", 1)
        foreign = f"{'f' * len(nonce)}-{rest}"
        assert foreign != step.idempotency_key
        harness.world.reuse_serial("0x40000001", "orc minion", "britain", tag=step.idempotency_key)  # a summon
        harness.world.reuse_serial("0x7fff0001", "deer", "yew", tag=foreign)  # listed after it

        [swept] = await harness.engine.sweeper.sweep()
        assert (swept.orphans, swept.reverted, swept.unknown) == (1, 1, 1)
        assert harness.world.snapshot()["creatures"] == {"0x7fff0001": {"kind": "deer", "region": "yew"}}

    harness.run(body)

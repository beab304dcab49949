"""Pre-flight = start: a run that would borrow a setting another run holds, or call a
module that is offline, is refused when it is started, naming the holder or the module,
before any step is sent; `force` starts it
anyway and writes who overrode what to the audit log; the ledger still refuses the
borrow itself at dispatch."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.pool import NullPool
from tests.conftest import Harness

from roadie.engine.notify import Webhook
from roadie.errors import PreflightRefused
from roadie.store import dialects, tables

HOLDER = """
id: holder
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: dial
        with: {{lease: probe.dial, value: 2{hold}}}
"""

# Its first phase announces the event to every player (the probe records the call); its
# second borrows the dial another run holds: without pre-flight the run fails there, after
# its announcement went out.
WEEKEND = """
id: weekend
cleanup: auto
phases:
  - name: announce
    steps:
      - action: probe.make
        name: broadcast
        with: {answer: []}
  - name: borrow
    steps:
      - action: core.lease
        name: dial
        with: {lease: probe.dial, value: 3}
"""


async def _told(harness: Harness, run_id: int) -> list[str]:
    """The kinds of the notifications written about a run, in order."""
    engine = dialects.create_engine(harness.database_url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            n = tables.notifications
            query = select(n.c.kind).where(n.c.run_id == run_id).order_by(n.c.id)
            return [kind for (kind,) in await conn.execute(query)]
    finally:
        await engine.dispose()


async def _holder(harness: Harness, hold: str = "") -> int:
    run = await harness.start(HOLDER.format(hold=hold))
    [ended] = await harness.settle(run)
    assert ended.status == "succeeded", ended.error
    return run.id


def test_a_run_whose_setting_another_run_holds_is_refused_before_any_step_is_sent(harness: Harness) -> None:
    """Before: the run started, sent its broadcast, and failed at the borrow a second
    later. Now the start is refused, naming the run that holds the dial and who started
    it; no run is stored, and no step reaches the module."""

    async def body() -> None:
        holder = await _holder(harness)
        with pytest.raises(PreflightRefused) as refused:
            await harness.start(WEEKEND)
        assert f"probe.dial is held by run {holder} (started by cli) until its cleanup" in refused.value.message
        assert refused.value.message.startswith("run not started (nothing was sent): ")
        for _ in range(3):
            await harness.engine.tick()
        assert harness.probe.calls == []
        assert [r.id for r in await harness.store.list_runs()] == [holder]
        assert harness.probe.dial == 2

    harness.run(body)


def test_a_borrow_held_for_a_while_names_when_it_is_given_back(harness: Harness) -> None:
    """A holder whose borrow has a `for:` is named with the moment it runs out."""

    async def body() -> None:
        holder = await _holder(harness, hold=", for: 1h")
        with pytest.raises(PreflightRefused) as refused:
            await harness.start(WEEKEND)
        [lease] = await harness.store.leases_in_force()
        assert lease.until is not None
        expected = f"probe.dial is held by run {holder} (started by cli) until {lease.until:%Y-%m-%d %H:%M:%S} UTC"
        assert expected in refused.value.message

    harness.run(body)


def test_force_starts_it_anyway_audits_the_override_and_the_ledger_still_refuses_the_borrow(
    harness: Harness,
) -> None:
    """`force` starts the run over what pre-flight found, and the audit log has who did
    and what was overridden, in the transaction that made the run. Pre-flight is a look,
    not a claim: the ledger's own reservation at dispatch still refuses the borrow."""

    async def body() -> None:
        holder = await _holder(harness)
        run = await harness.engine.start_run(await harness.apply(WEEKEND), actor="alice", force=True)
        [forced] = await harness.store.list_audit(action="run.force")
        assert (forced.actor, forced.subject) == ("alice", f"run:{run.id}")
        assert forced.detail["event"] == "weekend"
        [overridden] = forced.detail["overridden"]
        assert (overridden["kind"], overridden["subject"], overridden["held_by"]) == ("lease", "probe.dial", holder)
        assert f"held by run {holder}" in overridden["message"]
        [ended] = await harness.settle(run)
        assert ended.status == "failed"
        assert f"probe.dial is already held by run {holder}" in (ended.error or "")
        assert len(harness.probe.calls) == 1  # what force let through: the broadcast went out
        assert harness.probe.dial == 2

    harness.run(body)


def test_a_free_setting_or_a_layer_over_others_is_not_refused(harness: Harness) -> None:
    """Only what the ledger would refuse refuses a start: a lease nobody holds, or a
    layer of a lease that stacks over another run's layer, start as before, with no
    `run.force` in the audit log."""
    layer = """
id: banner-{n}
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: banner
        with: {{lease: sandbox.motd, value: "banner {n}", priority: {n}}}
"""

    async def body() -> None:
        first = await harness.start(layer.format(n=1))
        [first] = await harness.settle(first)
        second = await harness.start(layer.format(n=2))
        [second] = await harness.settle(second)
        assert (first.status, second.status) == ("succeeded", "succeeded")
        run = await harness.start(WEEKEND)
        [ended] = await harness.settle(run)
        assert ended.status == "succeeded", ended.error
        assert await harness.store.list_audit(action="run.force") == []

    harness.run(body)


def test_a_scheduled_run_into_a_held_setting_ends_failed_with_the_reason_before_any_step(harness: Harness) -> None:
    """Before: the occurrence's run started, sent its first phase and failed at the
    borrow. Now the worker makes the occurrence's run (it is spent, as any occurrence),
    failed, with pre-flight's reason as its error; it ends before any step is sent, the
    audit log has `run.refused` by `schedule`, and a `run.failed` notification tells it."""
    scheduled = WEEKEND.replace("cleanup: auto\n", "cleanup: auto\nschedule:\n  at: ['2026-01-01T00:10:00Z']\n")

    # A webhook is known, so notifications are written (nothing listens at port 9).
    harness.webhooks = [Webhook(name="ops", url="http://127.0.0.1:9/", secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]

    async def body() -> None:
        holder = await _holder(harness)
        await harness.apply(scheduled)
        harness.clock.set(datetime(2026, 1, 1, 0, 10, tzinfo=UTC))
        for _ in range(3):
            await harness.engine.tick()
        run = next(r for r in await harness.store.list_runs() if r.id != holder)
        assert run.schedule_key is not None
        assert run.status == "failed"
        assert run.error == (
            "refused by pre-flight before any step was sent: "
            f"probe.dial is held by run {holder} (started by cli) until its cleanup"
        )
        assert await harness.steps(run) == []
        assert harness.probe.calls == []
        [refused] = await harness.store.list_audit(action="run.refused")
        assert (refused.actor, refused.subject) == ("schedule", f"run:{run.id}")
        assert await _told(harness, run.id) == ["run.failed"]

    harness.run(body)


def test_a_run_that_would_call_a_module_that_is_offline_is_refused_the_same_way(harness: Harness) -> None:
    """A module whose `online` hook says it cannot reach its world refuses the start,
    naming the module and why, before any step is sent; `force` starts it anyway, audited
    with the module overridden. A run that calls only other modules starts as before."""
    harness.probe.offline = "the game server at 10.0.0.5:7300 does not answer"
    elsewhere = """
id: elsewhere
phases:
  - name: only
    steps:
      - action: sandbox.broadcast
        with: {message: "hello"}
"""

    async def body() -> None:
        with pytest.raises(PreflightRefused) as refused:
            await harness.start(WEEKEND)
        assert "module probe is offline: the game server at 10.0.0.5:7300 does not answer" in refused.value.message
        assert await harness.store.list_runs() == []
        run = await harness.start(elsewhere)
        [ended] = await harness.settle(run)
        assert ended.status == "succeeded"
        assert harness.probe.calls == []
        forced = await harness.start(WEEKEND, force=True)
        [audit] = await harness.store.list_audit(action="run.force")
        assert audit.subject == f"run:{forced.id}"
        assert [(o["kind"], o["subject"]) for o in audit.detail["overridden"]] == [("module", "probe")]

    harness.run(body)

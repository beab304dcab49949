"""The run engine (DESIGN §2): retries, failures, timeouts, phases, duration, cancel,
concurrency, crash recovery and when cleanup starts."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event
from tests.conftest import Crash, Harness

from roadie.definitions import FrozenDefinition
from roadie.engine import Engine, EngineOptions
from roadie.errors import DefinitionError, StoreError
from roadie.states import STEP_KIND, StepStatus
from roadie.store import Outcome, mint_token, tables


def probe_event(steps: str, *, duration: str = "0s", cleanup: str = "auto", event_id: str = "engine") -> str:
    return f"""
id: {event_id}
duration: {duration}
cleanup: {cleanup}
phases:
{steps}
"""


def test_a_retry_reuses_the_key_and_backs_off_exponentially(harness: Harness) -> None:
    """A retryable failure is tried again under the same idempotency key, each wait longer
    than the last (backoff 1s doubling, no jitter), and every attempt is counted."""
    event = probe_event("""
  - name: only
    steps:
      - action: probe.make
        name: flaky
        with: {fail_first: 3}
        retry: {attempts: 5, backoff: 1s, jitter: 0}
""")

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        step = await harness.step(run, "flaky")
        calls = harness.probe.calls
        assert {c.key for c in calls} == {step.idempotency_key}
        assert [c.attempt for c in calls] == [1, 2, 3, 4]
        gaps = [(b.at - a.at).total_seconds() for a, b in itertools.pairwise(calls)]
        assert gaps == [1.0, 2.0, 4.0]
        assert (step.status, step.attempts, run.status) == ("succeeded", 4, "succeeded")
        assert [e["result"] for e in step.attempt_log or []] == ["retry", "retry", "retry", "succeeded"]

    harness.run(body)


def test_retries_run_out_and_fail_the_step(harness: Harness) -> None:
    """A step that keeps failing retryably fails after its attempt limit, saying so."""
    event = probe_event("""
  - name: only
    steps:
      - action: probe.make
        name: hopeless
        with: {error: retryable}
        retry: {attempts: 3, backoff: 1s}
""")

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        step = await harness.step(run, "hopeless")
        assert (step.status, step.attempts, len(harness.probe.calls)) == ("failed", 3, 3)
        assert step.error is not None
        assert "gave up after 3 attempts" in step.error
        assert run.status == "failed"

    harness.run(body)


def test_a_permanent_failure_fails_the_step_and_the_run(harness: Harness) -> None:
    """A permanent failure is not retried; it fails its step and the run, and no later
    phase is materialised."""
    event = probe_event("""
  - name: first
    steps:
      - action: probe.make
        name: broken
        with: {error: permanent}
        retry: {attempts: 5}
  - name: second
    steps:
      - action: probe.make
        name: never
""")

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        step = await harness.step(run, "broken")
        assert (step.status, step.attempts) == ("failed", 1)
        assert run.status == "failed"
        assert run.error is not None
        assert "broken" in run.error
        assert "probe: this can never work" in run.error
        assert [s.name for s in await harness.steps(run)] == ["broken"]

    harness.run(body)


def test_on_error_continue_lets_the_run_succeed(harness: Harness) -> None:
    """A step with `on_error: continue` fails alone: the run goes on and succeeds."""
    event = probe_event("""
  - name: first
    steps:
      - action: probe.make
        name: broken
        with: {error: permanent}
        on_error: continue
  - name: second
    steps:
      - action: probe.make
        name: after
""")

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        assert (await harness.step(run, "broken")).status == "failed"
        assert (await harness.step(run, "after")).status == "succeeded"
        assert (run.status, run.error) == ("succeeded", None)

    harness.run(body)


def test_a_step_that_never_answers_times_out_is_retried_then_fails(harness: Harness) -> None:
    """A step gets `timeout` seconds of the clock per attempt; a hung call is cancelled,
    retried under the same key, and the step fails when attempts run out."""
    event = probe_event("""
  - name: only
    steps:
      - action: probe.make
        name: hung
        with: {hang: true}
        timeout: 5s
        retry: {attempts: 2, backoff: 1s, jitter: 0}
""")

    async def body() -> None:
        run = await harness.start(event)
        started = harness.clock.now()
        [run] = await harness.drive(harness.settle(run))
        step = await harness.step(run, "hung")
        assert (step.status, step.attempts, run.status) == ("failed", 2, "failed")
        assert step.error == "no answer within 5s (gave up after 2 attempts)"
        calls = harness.probe.calls
        assert [c.outcome for c in calls] == ["cancelled", "cancelled"]
        assert {c.key for c in calls} == {step.idempotency_key}
        # attempt 2 began after attempt 1's 5s timeout and its 1s backoff
        assert [c.at - started for c in calls] == [timedelta(0), timedelta(seconds=6)]

    harness.run(body)


def test_a_phase_waits_for_its_after_delay(harness: Harness) -> None:
    """`after: 10s` keeps a phase's steps out of the database until 10s after the
    previous phase ended."""
    event = probe_event("""
  - name: first
    steps:
      - action: probe.make
        name: early
  - name: second
    after: 10s
    steps:
      - action: probe.make
        name: late
""")

    async def body() -> None:
        run = await harness.start(event)
        await harness.engine.tick()
        assert [s.name for s in await harness.steps(run)] == ["early"]
        harness.clock.advance(9.9)
        await harness.engine.tick()
        assert [s.name for s in await harness.steps(run)] == ["early"]
        harness.clock.advance(0.1)
        await harness.engine.tick()
        late = await harness.step(run, "late")
        assert late.status == "succeeded"
        assert late.created_at == run.created_at + timedelta(seconds=10)

    harness.run(body)


def test_a_run_holds_until_its_duration_is_over(harness: Harness) -> None:
    """After its last phase a run stays `running` until its duration is spent."""
    event = probe_event(
        """
  - name: only
    steps:
      - action: probe.make
""",
        duration="1m",
    )

    async def body() -> None:
        run = await harness.start(event)
        await harness.engine.tick()
        assert (await harness.get_run(run)).status == "running"
        harness.clock.advance(59)
        await harness.engine.tick()
        assert (await harness.get_run(run)).status == "running"
        harness.clock.advance(1)
        await harness.engine.tick()
        run = await harness.get_run(run)
        assert run.status == "succeeded"
        assert run.ended_at == run.created_at + timedelta(minutes=1)

    harness.run(body)


def test_cancel_stops_dispatch_lets_in_flight_answer_then_cleans_up(harness: Harness) -> None:
    """Cancel is not kill: steps not yet dispatched never are, the step in flight
    answers and is recorded, then the run ends `cancelled` and is cleaned up."""
    harness.options = EngineOptions(concurrency=1, seed=1)
    event = probe_event("""
  - name: first
    steps:
      - action: probe.make
        name: slow
        with: {hold: 30, answer: [{kind: thing, ref: slow}]}
      - action: probe.make
        name: queued
  - name: second
    steps:
      - action: probe.make
        name: later
""")

    async def body() -> None:
        run = await harness.start(event)
        tick = asyncio.ensure_future(harness.engine.tick())
        while not harness.probe.calls:
            await asyncio.sleep(0.005)
        assert await harness.engine.cancel_run(run.id, actor="ops")
        # Another worker looking now must neither end the run nor start its cleanup while
        # a step is still out in the world.
        other = Engine(harness.store, harness.registry, clock=harness.clock, options=harness.options)
        await other.tick()
        assert (await harness.get_run(run)).status == "running"
        assert harness.probe.reverts == []
        harness.clock.advance(30)  # the slow step answers now
        await tick
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == ("cancelled", "complete")
        slow, queued = await harness.steps(run)
        assert slow.status == "succeeded"
        assert (queued.status, queued.error) == ("skipped", "run cancelled")
        assert [c.key for c in harness.probe.calls] == [slow.idempotency_key]
        [thing] = await harness.resources(run, "thing")
        assert thing.state == "reverted"
        [revert] = harness.probe.reverts
        assert [r.ref for r in revert.resources] == ["slow"]

    harness.run(body)


def test_steps_of_a_phase_run_concurrently_up_to_the_limit(harness: Harness) -> None:
    """Steps of one phase are dispatched together, but never more at once than the
    engine's concurrency."""
    harness.options = EngineOptions(concurrency=3, seed=1)
    steps = "\n".join("      - action: probe.make\n        with: {hold: 1}" for _ in range(7))
    event = probe_event(f"  - name: crowd\n    steps:\n{steps}")

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.drive(harness.settle(run))
        assert run.status == "succeeded"
        assert len(harness.probe.calls) == 7
        assert harness.probe.max_in_flight == 3

    harness.run(body)


def test_a_crash_while_materialising_is_repaired_by_a_fresh_engine(harness: Harness) -> None:
    """A worker that dies before a phase's steps commit leaves the run as it was; a
    fresh engine on the same files materialises the phase (once) and carries on."""
    event = """
id: crash-materialise
phases:
  - name: first
    steps:
      - action: sandbox.spawn
        with: {kind: orc, region: britain}
  - name: second
    steps:
      - action: sandbox.spawn
        with: {kind: orc captain, region: britain}
      - action: sandbox.place_item
        with: {kind: chest, region: britain}
"""
    before = harness.world.snapshot()
    harness.write_points.arm("materialise_phase", skip=1)  # the second phase's

    async def body() -> None:
        run = await harness.start(event)
        with pytest.raises(Crash):
            await harness.settle(run)
        assert [s.phase for s in await harness.steps(run)] == [0]
        await harness.restart()
        [run] = await harness.settle(run)
        assert run.status == "succeeded"
        assert [(s.phase, s.seq, s.status) for s in await harness.steps(run)] == [
            (0, 0, "succeeded"),
            (1, 0, "succeeded"),
            (1, 1, "succeeded"),
        ]
        creates = [e for e in harness.world.effects() if e["op"] == "create"]
        assert len(creates) == 3
        assert harness.world.snapshot() == before

    harness.run(body)


def test_answers_whose_recording_failed_are_recorded_again_not_redispatched(harness: Harness) -> None:
    """When the database refuses the batch of answers (it is restarting, say), the worker
    keeps the answers and records them again: the step is dispatched once, not retried
    after its claim expires."""
    failures = {"left": 2}

    def flaky_database(name: str) -> None:
        if name == "record_outcomes" and failures["left"]:
            failures["left"] -= 1
            raise StoreError("record_outcomes: the server is restarting")

    harness.write_points.extra = flaky_database

    async def body() -> None:
        run = await harness.start(
            probe_event("""
  - name: only
    steps:
      - action: probe.make
        name: once
        with: {answer: [{kind: thing, ref: t1}]}
""")
        )
        [run] = await harness.settle(run)
        step = await harness.step(run, "once")
        assert (run.status, step.status, step.attempts) == ("succeeded", "succeeded", 1)
        assert len(harness.probe.calls) == 1
        assert failures["left"] == 0
        assert [r.state for r in await harness.resources(run, "thing")] == ["reverted"]

    harness.run(body)


def test_a_recording_that_failed_at_its_claim_keeps_neither_and_records_alone(harness: Harness) -> None:
    """The transaction that records a batch and claims the next fails at the claim (the
    connection lost as it commits, say): neither is kept. The answers are recorded again
    on their own, as a recording that fails is, and the next steps claimed apart; every
    step is dispatched once."""
    harness.options = EngineOptions(seed=1, concurrency=2)
    calls: list[str] = []
    failed: list[str] = []

    def fail_one_claim_with_a_recording(name: str) -> None:
        if name == "claim_steps" and calls[-1] == "record_and_claim" and not failed:
            failed.append(name)
            raise StoreError("claim_steps: the connection was lost while committing")

    async def body() -> None:
        store = harness.store
        for name in ("claim_steps", "record_outcomes", "record_and_claim"):
            method = getattr(store, name)

            async def logged(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
                calls.append(_name)
                return await _method(*args, **kwargs)

            setattr(store, name, logged)
        harness.write_points.extra = fail_one_claim_with_a_recording
        steps = "\n".join(f"      - {{action: probe.make, name: s{i}}}" for i in range(4))
        run = await harness.start(f"id: apart\ncleanup: manual\nphases:\n  - name: only\n    steps:\n{steps}\n")
        [run] = await harness.settle(run)
        if not store.joins_claims:  # MariaDB claims apart from its recordings
            assert "record_and_claim" not in calls, calls
            assert not failed
        else:
            assert failed, "a recording's claim should have failed"
            assert calls[:4] == ["claim_steps", "record_and_claim", "claim_steps", "record_outcomes"], calls
        assert run.status == "succeeded"
        keys = [c.key for c in harness.probe.calls]
        assert len(keys) == len(set(keys)) == 4, "every step is dispatched once"
        assert [s.attempts for s in await harness.steps(run)] == [1, 1, 1, 1]

    harness.run(body)


def test_a_crash_before_recording_is_recovered_by_claim_expiry(harness: Harness) -> None:
    """A worker that dispatched and died before recording the answer loses its claim
    after `claim_ttl`; the step is retried under the same key, the world makes nothing
    twice, and every object is recorded and cleaned up once."""
    event = """
id: crash-record
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
"""
    before = harness.world.snapshot()
    harness.write_points.arm("record_outcomes")

    async def body() -> None:
        run = await harness.start(event)
        with pytest.raises(Crash):
            await harness.settle(run)
        assert len(harness.world.snapshot()["creatures"]) == 3
        step = await harness.step(run, "orcs")
        assert (step.status, step.attempts) == ("running", 1)
        await harness.restart()
        await harness.engine.tick()
        assert (await harness.step(run, "orcs")).status == "running"  # the claim still stands
        harness.clock.advance(harness.options.claim_ttl + 1)
        [run] = await harness.settle(run)
        step = await harness.step(run, "orcs")
        assert (run.status, step.status, step.attempts) == ("succeeded", "succeeded", 2)
        creates = [e["ref"] for e in harness.world.effects() if e["op"] == "create"]
        assert len(creates) == len(set(creates)) == 3
        creatures = await harness.resources(run, "creature")
        assert sorted(r.ref for r in creatures) == sorted(creates)
        assert {r.state for r in creatures} == {"reverted"}
        assert harness.world.snapshot() == before

    harness.run(body)


SPAWN = """
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 2}"""


@pytest.mark.parametrize(
    ("ending", "extra_phase", "duration"),
    [
        ("succeeded", "", "0s"),
        (
            "failed",
            "\n  - name: doomed\n    steps:\n      - action: sandbox.spawn\n"
            "        with: {kind: orc, region: atlantis}",
            "0s",
        ),
        ("cancelled", "", "1h"),
    ],
)
def test_auto_cleanup_runs_on_every_terminal_path(
    harness: Harness, ending: str, extra_phase: str, duration: str
) -> None:
    """With `cleanup: auto`, a dirty run is cleaned up whether it succeeded, failed or
    was cancelled, and the world is what it was before the run."""
    event = probe_event(f"  - name: spawn\n    steps:{SPAWN}{extra_phase}", duration=duration)
    before = harness.world.snapshot()

    async def body() -> None:
        run = await harness.start(event)
        if ending == "cancelled":
            await harness.engine.tick()
            assert len(harness.world.snapshot()["creatures"]) == 2
            await harness.engine.cancel_run(run.id)
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == (ending, "complete")
        assert harness.world.snapshot() == before

    harness.run(body)


def test_manual_cleanup_waits_for_a_human(harness: Harness) -> None:
    """With `cleanup: manual` an ended dirty run stays `pending` however long the worker
    runs; a human's `clean_up` takes it down and is audited under their name."""
    event = probe_event(f"  - name: spawn\n    steps:{SPAWN}", cleanup="manual")
    before = harness.world.snapshot()

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        harness.clock.advance(3600)
        await harness.engine.tick()
        run = await harness.get_run(run)
        assert (run.status, run.cleanup_status) == ("succeeded", "pending")
        assert len(harness.world.snapshot()["creatures"]) == 2
        report = await harness.engine.clean_up(run.id, actor="alice")
        assert (report.status, report.reverted) == ("complete", 2)
        assert (await harness.get_run(run)).cleanup_status == "complete"
        assert harness.world.snapshot() == before
        [audit] = [a for a in await harness.store.list_audit(f"run:{run.id}") if a.action == "cleanup"]
        assert audit.actor == "alice"

    harness.run(body)


def test_a_run_that_ledgers_nothing_needs_no_cleanup(harness: Harness) -> None:
    """Actions of class `none` and `self` record nothing: the run ends `not_required` and
    cleanup never runs."""
    event = probe_event("""
  - name: only
    steps:
      - action: sandbox.broadcast
        with: {message: hello}
      - action: sandbox.buff
        with: {name: blessing, region: britain, duration: 5s}
      - action: core.log
        with: {message: hi}
""")

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status, run.cleanup_report) == ("succeeded", "not_required", None)
        assert await harness.resources(run) == []

    harness.run(body)


def test_settle_takes_over_a_claim_at_the_moment_it_expires(harness: Harness) -> None:
    """A step left claimed by this very worker (it lost track of the dispatch, e.g. after
    recording failed for good) is due again when its claim expires: the clock jumps to
    that moment and the step is taken over then, instead of the worker waiting on a
    moment it has already reached."""
    event = probe_event("""
  - name: only
    steps:
      - action: probe.make
        name: orphan
        with: {answer: [{kind: thing, ref: orphan}]}
""")

    async def body() -> None:
        run = await harness.start(event)
        harness.write_points.arm("record_outcomes")
        with pytest.raises(Crash):
            await harness.engine.tick()
        assert (await harness.step(run, "orphan")).status == "running"
        [run] = await harness.settle(run, max_ticks=50)
        step = await harness.step(run, "orphan")
        assert (run.status, step.status, step.attempts) == ("succeeded", "succeeded", 2)

    harness.run(body)


RAID = """
id: raid
params:
  region: {type: str, default: britain}
  count: {type: int, default: 1, min: 1}
cleanup: auto
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        with: {kind: orc, region: "{{ region }}", count: "{{ count }}"}
"""


def test_many_runs_are_started_in_one_transaction_and_one_bad_param_refuses_them_all(harness: Harness) -> None:
    """`start_runs` makes every run (each with its params, its audit entry) in one write
    transaction; a bad parameter in any entry refuses them all, naming the entry."""

    async def body() -> None:
        event = await harness.apply(RAID)
        before = harness.store_writes("create_run")
        made = await harness.engine.start_runs(event, [{}, {"count": 2}, {"region": "yew"}, {}], actor="ops")
        assert harness.store_writes("create_run") == before + 1
        assert [(r.params["region"], r.params["count"]) for r in made] == [
            ("britain", 1),
            ("britain", 2),
            ("yew", 1),
            ("britain", 1),
        ]
        assert len({r.id for r in made}) == 4
        audit = await harness.store.list_audit()
        assert sorted(a.subject for a in audit if a.action == "run.start") == sorted(f"run:{r.id}" for r in made)
        with pytest.raises(DefinitionError) as refused:
            await harness.engine.start_runs(event, [{}, {"count": 0}], actor="ops")
        assert refused.value.problems[0].field == "runs[1].params"
        assert len(await harness.store.list_runs()) == 4
        settled = await harness.settle(*made)
        assert [r.status for r in settled] == ["succeeded"] * 4

    harness.run(body)


def test_hundreds_of_large_runs_started_at_once_all_go_in(harness: Harness) -> None:
    """500 runs of 100 steps, about 20 MiB of definitions, started in one call. MariaDB
    drops a statement past its `max_allowed_packet` (16 MiB) with the connection, and the
    runs were one statement: the start failed as a lost connection, after 13 s of trying
    again. They go in a few MiB at a time now, still in one transaction."""
    answer = "{answer: [{kind: thing, ref: " + "r" * 200 + "}]}"  # (bytes enough: about 40 KiB a run)
    steps = "\n".join(f"      - action: probe.make\n        name: make-{i}\n        with: {answer}" for i in range(100))
    big = f"id: big\ncleanup: manual\nphases:\n  - name: only\n    steps:\n{steps}\n"

    async def body() -> None:
        event = await harness.apply(big)
        before = harness.store_writes("create_run")
        made = await harness.engine.start_runs(event, [{}] * 500, actor="ops")
        assert harness.store_writes("create_run") == before + 1
        assert len({r.id for r in made}) == 500
        assert len(await harness.store.list_runs(limit=1000)) == 500

    harness.run(body)


def test_run_id_renders_into_a_steps_parameters(harness: Harness) -> None:
    """`{{ run.id }}` is the run's id, written in as text, though a run is rendered before
    its row exists."""
    text = """
id: numbered
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.log
        name: hello
        with: {message: "run {{ run.id }} of {{ event.id }}"}
      - action: sandbox.broadcast
        name: say
        with: {message: "{{ run.id }}"}
"""

    async def body() -> None:
        first = await harness.start(text)
        second = await harness.start(text)
        await harness.settle(first, second)
        for run in (first, second):
            steps = {s.name: s for s in await harness.store.list_steps(run.id)}
            assert steps["hello"].params["message"] == f"run {run.id} of numbered"
            assert steps["say"].params["message"] == str(run.id)

    harness.run(body)


async def _make_steps_two_at_a_time(harness: Harness, event_id: str, count: int) -> None:
    """One run of `count` `probe.make` steps in one phase, under the concurrency of 2 the
    tests below set: it succeeds with a placeholder per step, never more than 2 in flight
    (a step claimed ahead is not dispatched ahead)."""
    steps = "\n".join(f"      - {{action: probe.make, name: s{i}}}" for i in range(count))
    run = await harness.start(f"id: {event_id}\ncleanup: manual\nphases:\n  - name: only\n    steps:\n{steps}\n")
    [done] = await harness.settle(run)
    assert done.status == "succeeded"
    assert len(await harness.resources(run, STEP_KIND)) == count
    assert harness.probe.max_in_flight == 2


@pytest.mark.parametrize("ahead", [1, 0])
def test_a_slot_an_answer_frees_is_filled_before_the_answer_is_recorded(harness: Harness, ahead: int) -> None:
    """Issue 14: while a dispatch is still out when the worker claims, it claims
    `claim_ahead` steps beyond its concurrency, their ledger rows reserved like any
    other's, so the slot the next answer frees is dispatched again at once instead of
    two commits later (record the answer, claim the next). With `claim_ahead=0` each
    dispatch waits for the answer before it to be recorded."""
    harness.options = EngineOptions(seed=1, concurrency=2, claim_ahead=ahead)
    order: list[str] = []
    harness.write_points.extra = lambda name: order.append(name) if name == "record_outcomes" else None
    release = asyncio.Event()

    async def observe(call: Any) -> None:
        order.append("dispatch")
        dispatched = order.count("dispatch")
        if dispatched == 4:
            release.set()
        # Every step's placeholder was committed before its dispatch, ahead or not.
        placeholders = await harness.peek(tables.run_resources.c.step_id, tables.run_resources.c.kind)
        assert (call.step_id, STEP_KIND) in placeholders
        if dispatched == 2:  # out while the others come and go
            await release.wait()

    harness.probe.observe = observe
    harness.run(lambda: _make_steps_two_at_a_time(harness, "ahead", 4))
    if ahead:
        assert order[:6] == ["dispatch", "dispatch", "record_outcomes", "dispatch", "dispatch", "record_outcomes"]
    else:
        assert order[:6] == ["dispatch", "dispatch", "record_outcomes", "dispatch", "record_outcomes", "dispatch"]


def test_a_slot_freed_while_answers_are_recorded_is_filled_before_the_next_commit(harness: Harness) -> None:
    """Issue 14: an answer that comes in while the drain records a batch frees its slot as
    soon as that commit is done: the next step claimed ahead is dispatched then, not after
    another commit; the answer goes with the next recording. And the transaction that
    records a batch claims the slots it frees: one commit, both write points before it.

    Concurrency 2, up to 2 claimed ahead, s0 out throughout. s1 answers and is recorded,
    and s2-s4 claimed with it (s2 dispatched, s3 and s4 ahead); s2 answers, s3 is
    dispatched in its slot and the recording of s2 begins, claiming s5; s3 answers while
    it is under way (the probe answers at once)."""
    harness.options = EngineOptions(seed=1, concurrency=2, claim_ahead=2)
    order: list[str] = []
    commits: list[int] = []  # the commits made before each entry of `order`
    made = itertools.count()
    done = next(made)

    def note(name: str) -> None:
        order.append(name)
        commits.append(done)

    harness.write_points.extra = lambda name: note(name) if name in ("record_outcomes", "claim_steps") else None
    release = asyncio.Event()

    async def observe(call: Any) -> None:
        note("dispatch")
        if order.count("dispatch") == 1:  # s0: out while the others come and go
            await release.wait()
        if order.count("dispatch") == 5:  # s4: the last of the first five
            release.set()

    def committed(conn: Any) -> None:
        nonlocal done
        done = next(made)

    joins: list[bool] = []  # whether the store joins a recording and the next claim

    async def body() -> None:
        joins.append(harness.store.joins_claims)
        event.listen(harness.store.engine.sync_engine, "commit", committed)
        await _make_steps_two_at_a_time(harness, "refill", 6)

    harness.probe.observe = observe
    harness.run(body)
    # MariaDB claims apart from its recordings (its claim is three statements).
    joined = joins[0]
    expected = [
        "claim_steps",  # s0, s1
        "dispatch",
        "dispatch",
        "record_outcomes",  # s1
        "claim_steps",  # s2, s3, s4, in the same transaction
        "dispatch",  # s2
        "dispatch",  # s3, in s2's slot
        "record_outcomes",  # s2, while s3 answers
        *(["claim_steps"] if joined else []),  # s5, in the same transaction
        "dispatch",  # s4, in s3's slot: right after that commit
    ]
    assert order[: len(expected)] == expected, order
    first, second = [i for i, name in enumerate(order) if name == "record_outcomes"][:2]
    if joined:
        assert commits[first] == commits[first + 1], "s1's recording and the claim of s2-s4 are one commit"
        assert commits[second] == commits[second + 1], "s2's recording and the claim of s5 are one commit"
    else:
        assert commits[first] < commits[first + 1], "s1's recording and the claim of s2-s4 are two commits"
    assert commits[len(expected) - 1] == commits[second] + 1, "s4 is dispatched before any other commit"


def test_a_step_claimed_ahead_is_not_dispatched_once_its_run_is_cancelled(harness: Harness) -> None:
    """Cancel stops every step not yet dispatched, a step claimed ahead included: it ends
    skipped without reaching the world, and its placeholder resolves with nothing to
    revert. What was dispatched before the cancel answers and is recorded."""
    harness.options = EngineOptions(seed=1, concurrency=2, claim_ahead=1)
    release = asyncio.Event()
    run_ids: list[int] = []

    async def observe(call: Any) -> None:
        dispatched = len(harness.probe.calls)
        if dispatched == 2:  # out while the others come and go
            await release.wait()
        if dispatched == 3:  # the fourth step is held ahead by now
            assert await harness.engine.cancel_run(run_ids[0], actor="ops")
            release.set()

    async def body() -> None:
        harness.probe.observe = observe
        steps = "\n".join(f"      - {{action: probe.make, name: s{i}}}" for i in range(4))
        run = await harness.start(f"id: ahead\ncleanup: auto\nphases:\n  - name: only\n    steps:\n{steps}\n")
        run_ids.append(run.id)
        [done] = await harness.settle(run)
        assert (done.status, done.cleanup_status) == ("cancelled", "complete")
        s0, s1, s2, s3 = await harness.steps(run)
        assert [s.status for s in (s0, s1, s2)] == ["succeeded"] * 3
        assert (s3.status, s3.error) == ("skipped", "run cancelled")
        assert s3.idempotency_key not in [c.key for c in harness.probe.calls]
        [placeholder] = [r for r in await harness.resources(run, STEP_KIND) if r.ref == s3.idempotency_key]
        assert placeholder.state == "resolved"
        assert harness.probe.reverts == []

    harness.run(body)


def test_a_retry_skipped_ahead_leaves_its_placeholder_for_cleanup(harness: Harness) -> None:
    """Found by the simulation (seed 227): a step's first attempt timed out (it may have
    written the world; its placeholder stays pending so that cleanup reverts by key),
    its retry was claimed ahead, and the run was cancelled before the retry went out.
    Skipped, the retry resolved the placeholder as if nothing had been made, and cleanup
    never asked the module to revert the key. Only a first attempt skipped ahead
    resolves it (`test_a_step_claimed_ahead_is_not_dispatched_once_its_run_is_cancelled`);
    a retry leaves it pending, and cleanup reverts the key."""

    async def body() -> None:
        store, engine = harness.store, harness.engine
        run = await harness.start(probe_event("  - name: only\n    steps:\n      - {action: probe.make, name: s0}\n"))
        await engine._advance()  # the phase begins: its step is ready
        now = harness.clock.now()
        [first] = await store.claim_steps("w", now, 1, 60, token=mint_token("w"))
        lost = Outcome(step=first.step, status=StepStatus.READY, at=now, not_before=now, error="no answer within 30s")
        await store.record_outcomes([lost])
        retry = await store.claim_steps("w", now, 1, 60, token=mint_token("w"))
        assert [c.step.attempts for c in retry] == [2]
        assert await engine.cancel_run(run.id, actor="ops")
        [skipped] = await engine._dispatch_ahead({}, deque(retry))
        assert (skipped.status, skipped.resolve_placeholder) == (StepStatus.SKIPPED, False)
        await store.record_outcomes([skipped])
        [placeholder] = await harness.resources(run, STEP_KIND)
        assert placeholder.state == "pending"
        [done] = await harness.settle(run)
        assert (done.status, done.cleanup_status) == ("cancelled", "complete")
        assert [(r.idempotency_key, r.resources) for r in harness.probe.reverts] == [(first.step.idempotency_key, [])]
        assert harness.probe.calls == [], "nothing was dispatched"

    harness.run(body)


def test_a_run_started_here_is_advanced_from_the_definition_it_was_made_with(harness: Harness) -> None:
    """Issue 14: the engine that creates a run keeps its frozen definition, so that its
    advance neither reads it back nor parses it again; what it keeps is what was stored.
    A run it did not make is read once and kept the same way."""
    read: list[int] = []

    async def body() -> None:
        store, engine = harness.store, harness.engine
        original = store.runs_in_flight

        async def runs_in_flight(known: Any = ()) -> Any:
            found = await original(known)
            read.extend(c.run.id for c in found if c.run.definition)
            return found

        store.runs_in_flight = runs_in_flight  # type: ignore[method-assign]
        phases = "  - name: one\n    steps:\n      - {action: probe.make, name: a}\n"
        phases += "  - name: two\n    steps:\n      - {action: probe.make, name: b}\n"
        text = probe_event(phases, cleanup="manual")
        run = await harness.start(text)
        stored = await store.get_run(run.id)
        assert engine._definitions[run.id] == FrozenDefinition.model_validate(stored.definition)
        # The run as created answers the definition it was given, not read back: the same.
        assert run.definition == stored.definition
        assert run == stored
        elsewhere = Engine(store, harness.registry, clock=harness.clock, options=harness.options)
        [other] = await elsewhere.start_runs(await store.get_event("engine"), [{}])
        await elsewhere.close()
        done = await harness.settle(run, other)
        assert [d.status for d in done] == ["succeeded", "succeeded"]
        assert read == [other.id], "only the run made elsewhere is read back, once"
        assert [s.name for s in await harness.steps(run)] == ["a", "b"]

    harness.run(body)


def test_a_run_is_marked_for_cleanup_once_unless_the_mark_was_not_kept(harness: Harness) -> None:
    """Issue 14: the mark that a run has something to clean up (`not_required` to
    `pending`) is written by the first transaction that reserves or records its rows,
    not by every one after it: nothing walks a run back to `not_required`. A mark whose
    transaction failed is not taken as made: the next transaction makes it."""
    marks: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if " ".join(statement.split()).lower().startswith("update runs set cleanup_status"):
            marks.append(statement)

    def fail(name: str) -> None:
        if name == "claim_steps" and not marks[1:]:
            raise StoreError("claim_steps: the connection was lost while committing")

    async def body() -> None:
        store, engine = harness.store, harness.engine
        steps = "\n".join(f"      - {{action: probe.make, name: s{i}}}" for i in range(3))
        run = await harness.start(probe_event(f"  - name: only\n    steps:\n{steps}\n", cleanup="manual"))
        await engine._advance()  # the phase begins: its steps are ready
        event.listen(store.engine.sync_engine, "before_cursor_execute", count)
        harness.write_points.extra = fail
        now = harness.clock.now()
        with pytest.raises(StoreError):
            await store.claim_steps("w", now, 1, 60, token=mint_token("w"))
        assert len(marks) == 1
        assert (await store.get_run(run.id)).cleanup_status == "not_required"
        [first] = await store.claim_steps("w", now, 1, 60, token=mint_token("w"))
        assert len(marks) == 2, "the mark that was not kept is made again"
        assert (await store.get_run(run.id)).cleanup_status == "pending"
        made = Outcome(step=first.step, status=StepStatus.SUCCEEDED, at=now, resolve_placeholder=False)
        await store.record_and_claim([made], "w", now, 2, 60, token=mint_token("w"))
        assert len(marks) == 2, "a run marked once is not marked again"
        [done] = await harness.settle(run)
        assert (done.status, done.cleanup_status) == ("succeeded", "pending")
        assert len(marks) == 2

    harness.run(body)


def test_an_event_file_longer_than_64_kb_is_stored_whole(harness: Harness) -> None:
    """An event file may hold 4,000,000 characters; MariaDB's TEXT column held 65,535
    bytes and refused a longer one with the database's own error. Its text is stored and
    read back whole on every database."""
    padding = "\n".join(f"# {'é' * 60} line {i}" for i in range(2000))  # 2-byte characters: ~250 KB
    text = f"id: long\ncleanup: manual\nphases:\n  - name: only\n    steps:\n      - action: probe.make\n{padding}\n"

    async def body() -> None:
        stored = await harness.apply(text)
        assert len(text.encode()) > 200_000
        assert (await harness.store.get_event("long", stored.version)).source == text

    harness.run(body)

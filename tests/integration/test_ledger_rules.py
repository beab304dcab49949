"""The ledger's write half (DESIGN §4): what is recorded, when, and what is refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tests.conftest import Harness

from roadie.errors import InvalidState
from roadie.registry import Answer, Call
from roadie.store import NewResource, tables


def one_step(with_: dict[str, Any], *, cleanup: str = "auto", retry: str = "", event_id: str = "ledger") -> str:
    """An event of one `probe.make` step named `make` with these parameters."""
    return f"""
id: {event_id}
cleanup: {cleanup}
phases:
  - name: only
    steps:
      - action: probe.make
        name: make
        with: {json.dumps(with_)}
        {retry}
"""


THING = {"kind": "thing", "ref": "thing-1"}


def test_placeholder_is_committed_before_the_action_is_called(harness: Harness) -> None:
    """Rule 1: when the module is called, a separate connection to the database already
    sees the step's `{@step, key}` row in state `pending`, naming the step's action and
    its place in the event."""
    seen: list[list[tuple[str, str, str, str, Any]]] = []

    async def look(call: Call[Any]) -> None:
        r = tables.run_resources.c
        seen.append(await harness.peek(r.owner, r.kind, r.ref, r.state, r.payload))

    harness.probe.observe = look

    async def body() -> None:
        run = await harness.start(one_step({"answer": [THING]}))
        await harness.settle(run)
        step = await harness.step(run, "make")
        where = {"action": "probe.make", "phase": 0, "seq": 0}
        assert seen == [[("probe", "@step", step.idempotency_key, "pending", where)]]

    harness.run(body)


@pytest.mark.parametrize("answer", [[], None, {"resources": [], "output": "nothing made"}])
def test_an_empty_answer_resolves_the_placeholder(harness: Harness, answer: Any) -> None:
    """Rule 1: an answer with no resources means "I made nothing": the placeholder is
    resolved, so cleanup never calls `revert` for the step."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": answer}))
        [run] = await harness.settle(run)
        [placeholder] = await harness.resources(run)
        assert (placeholder.kind, placeholder.state) == ("@step", "resolved")
        assert harness.probe.reverts == []
        assert run.cleanup_status == "complete"

    harness.run(body)


def test_a_lost_answer_leaves_the_placeholder_and_cleanup_reverts_by_key(harness: Harness) -> None:
    """Rule 1: an answer lost on every attempt leaves the placeholder `pending`; cleanup
    then calls `revert` once with the step's key and no resources."""

    async def body() -> None:
        run = await harness.start(one_step({"error": "lost"}, retry="retry: {attempts: 2, backoff: 1s}"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        assert step.status == "failed"
        assert step.attempts == 2
        assert [c.key for c in harness.probe.calls] == [step.idempotency_key] * 2
        [revert] = harness.probe.reverts
        assert (revert.idempotency_key, revert.resources) == (step.idempotency_key, [])
        [placeholder] = await harness.resources(run)
        assert (placeholder.kind, placeholder.state) == ("@step", "reverted")
        assert run.cleanup_status == "complete"

    harness.run(body)


def test_a_lost_sandbox_answer_is_taken_back_down_by_key(harness: Harness) -> None:
    """Rule 1 against a real world: the sandbox spawns, then loses every answer; nothing
    but the placeholder is recorded, and cleanup still restores the world exactly."""
    before = harness.world.snapshot()
    harness.world.lose_next(5, action="spawn")
    event = """
id: lost
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 3}
        retry: {attempts: 2, backoff: 1s}
"""

    async def body() -> None:
        run = await harness.start(event)
        await harness.engine.tick()
        assert len(harness.world.snapshot()["creatures"]) == 3
        [placeholder] = await harness.resources(run)
        assert (placeholder.kind, placeholder.state) == ("@step", "pending")
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == ("failed", "complete")
        assert [r.kind for r in await harness.resources(run)] == ["@step"]
        assert harness.world.snapshot() == before

    harness.run(body)


def test_the_same_resource_reported_twice_is_one_row(harness: Harness) -> None:
    """Rule 2: recording is idempotent. The same target in one answer, and again as a
    late report against the same step, makes one row and no rejection."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [THING, dict(THING)]}, cleanup="manual"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        assert step.rejections is None
        again = [NewResource("thing", "thing-1")]
        outcome = await harness.store.record_late_resources(step, again, harness.clock.now())
        assert outcome.rejections == []
        rows = await harness.resources(run, "thing")
        assert [(r.ref, r.state) for r in rows] == [("thing-1", "live")]

    harness.run(body)


def test_a_target_held_by_another_run_is_a_rejection_naming_it(harness: Harness) -> None:
    """Rule 2: a target another run holds is not recorded twice; the step succeeds with a
    rejection that names the holding run."""
    event = one_step({"answer": [THING]}, cleanup="manual")

    async def body() -> None:
        first = await harness.start(event)
        await harness.settle(first)
        second = await harness.start(event)
        [second] = await harness.settle(second)
        step = await harness.step(second, "make")
        assert step.status == "succeeded"
        assert step.rejections == [f"thing 'thing-1' is already held by run {first.id}"]
        assert await harness.resources(second, "thing") == []
        [held] = await harness.resources(first, "thing")
        assert held.state == "live"

    harness.run(body)


def test_two_runs_reporting_one_target_in_the_same_batch_make_one_row(harness: Harness) -> None:
    """Rule 2 within one batch of answers: two runs' steps answered together with the same
    target make one live row; the other step gets a rejection naming the run that holds it."""
    event = one_step({"answer": [THING]}, cleanup="manual")

    async def body() -> None:
        first = await harness.start(event)
        second = await harness.start(event)
        await harness.settle(first, second)
        steps = [await harness.step(run, "make") for run in (first, second)]
        assert harness.store_writes("record_outcomes") == 1, "both answers were recorded in one batch"
        held = [r for run in (first, second) for r in await harness.resources(run, "thing")]
        assert [r.state for r in held] == ["live"]
        holder = held[0].run_id
        loser = next(s for s in steps if s.run_id != holder)
        assert loser.rejections == [f"thing 'thing-1' is already held by run {holder}"]
        assert all(s.status == "succeeded" for s in steps)

    harness.run(body)


MALFORMED = [
    pytest.param("a string", "reported a resource that is not an object", id="not-an-object"),
    pytest.param(["kind", "ref"], "reported a resource that is not an object", id="a-list"),
    pytest.param({"kind": "", "ref": "r"}, "reported a resource with a bad kind ''", id="empty-kind"),
    pytest.param({"ref": "r"}, "reported a resource with a bad kind None", id="no-kind"),
    pytest.param({"kind": "k" * 65, "ref": "r"}, "reported a resource with a bad kind", id="kind-over-64"),
    pytest.param({"kind": "thing", "ref": ""}, "reported a resource with a bad ref ''", id="empty-ref"),
    pytest.param({"kind": "thing", "ref": "r" * 191}, "reported a resource with a bad ref", id="ref-over-190"),
    pytest.param({"kind": "@step", "ref": "forged"}, "reported a resource of the reserved kind '@step'", id="reserved"),
    pytest.param(
        {"kind": "thing", "ref": "m", "memberKey": "m" * 191},
        "reported a resource with an over-long memberKey",
        id="member-key-over-190",
    ),
    pytest.param(
        {"kind": "thing", "ref": "u", "until": "next tuesday"},
        "reported a resource with a bad until 'next tuesday'",
        id="bad-until",
    ),
    pytest.param(
        {"kind": "override", "ref": "probe.nothing"}, "reported a resource of the reserved kind 'override'", id="lease"
    ),
    pytest.param(
        # Even naming a registered lease: override rows are core's alone (it saves the
        # value to give back), so a module's would be a second live row for the target.
        {"kind": "override", "ref": "sandbox.weather#britain"},
        "reported a resource of the reserved kind 'override'",
        id="registered-lease",
    ),
]


@pytest.mark.parametrize(("bad", "reason"), MALFORMED)
def test_a_malformed_resource_is_refused_with_its_reason(harness: Harness, bad: Any, reason: str) -> None:
    """Rule 4: a bad entry is dropped with its reason in the step's rejections, never
    truncated into a row; the good entry beside it is recorded and the step succeeds."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [bad, THING]}, cleanup="manual"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        assert (step.status, step.attempts) == ("succeeded", 1)
        [rejection] = step.rejections or []
        assert rejection.startswith("probe.make " + reason)
        assert [(r.kind, r.ref) for r in await harness.resources(run) if r.kind != "@step"] == [("thing", "thing-1")]

    harness.run(body)


def test_resources_at_the_limits_are_recorded_whole(harness: Harness) -> None:
    """Rule 4's bounds are inclusive: a kind of 64, a ref and a memberKey of 190 and a
    parseable `until` all go in."""
    edge = {"kind": "k" * 64, "ref": "r" * 190, "memberKey": "m" * 190, "until": "2026-01-02T00:00:00Z"}

    async def body() -> None:
        run = await harness.start(one_step({"answer": [edge]}, cleanup="manual"))
        await harness.settle(run)
        step = await harness.step(run, "make")
        assert step.rejections is None
        rows = {r.kind: r for r in await harness.resources(run)}
        assert (rows["k" * 64].ref, rows["k" * 64].member_key) == ("r" * 190, "m" * 190)
        assert rows["k" * 64].until is not None

    harness.run(body)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("done!", "probe.make answered something that is not an answer: 'done!'"),
        ({"resources": "lots"}, "probe.make answered 'resources' that is not a list: 'lots'"),
        ({"made": []}, "probe.make answered something that is not an answer"),
        (Answer(resources="lots"), "probe.make answered 'resources' that is not a list: 'lots'"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_answer_is_refused_and_the_placeholder_stays(harness: Harness, answer: Any, reason: str) -> None:
    """Rule 4: an answer that cannot be read at all is rejected with its reason; the step
    still succeeds, but nobody knows what it made, so its placeholder stays `pending`."""
    if isinstance(answer, Answer):  # not something YAML can say: answered by the probe itself
        harness.probe.answer, answer = answer, None

    async def body() -> None:
        run = await harness.start(one_step({"answer": answer}, cleanup="manual"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        assert (run.status, step.status, step.attempts) == ("succeeded", "succeeded", 1)
        [rejection] = step.rejections or []
        assert rejection.startswith(reason)
        [placeholder] = await harness.resources(run)
        assert (placeholder.kind, placeholder.state) == ("@step", "pending")
        assert run.cleanup_status == "pending"

    harness.run(body)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            [{"kind": "thing", "ref": "odd", "payload": {"serials": {1, 2}}}, THING],
            "probe.make reported a resource whose payload is not JSON",
        ),
        (
            [{"kind": "thing", "ref": "odd", "payload": float("nan")}, THING],
            "probe.make reported a resource whose payload is not JSON",
        ),
        (Answer(resources=[THING], output=object()), "probe.make answered an output that is not JSON"),
    ],
    ids=["a-set", "not-a-number", "output"],
)
def test_what_the_database_cannot_store_is_a_rejection_not_a_crash(harness: Harness, answer: Any, reason: str) -> None:
    """Rule 5: recording never throws into the step. A payload or output no database can
    keep in JSON is dropped with its reason; the step and its good resources are recorded,
    and the world write is not retried."""
    harness.probe.answer = answer

    async def body() -> None:
        run = await harness.start(one_step({}, cleanup="manual"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        assert (step.status, step.attempts, step.output) == ("succeeded", 1, None)
        [rejection] = step.rejections or []
        assert rejection.startswith(reason)
        assert [r.ref for r in await harness.resources(run, "thing")] == ["thing-1"]

    harness.run(body)


MIXED = [
    {"name": "Grünwald orc", "tags": ["é", "\u2028", None], "big": 2**70, "ratio": 0.1, "nested": {"deep": [True, {}]}},
    None,
    "just text",
    [1, 2.5, -3],
    {},
]
LISTS = [["orc"], [["a", "b"], ["c", "d"]], [], [[1], []]]  # as an array of arrays would be written


@pytest.mark.parametrize("payloads", [MIXED, LISTS], ids=["mixed", "lists"])
def test_an_answers_resources_are_stored_as_they_were_answered(harness: Harness, payloads: list[Any]) -> None:
    """Rule 1: every resource of an answer is recorded with its payload exactly, whatever
    JSON it holds and however many come in one batch (past a statement's parameter chunk);
    so is the answer's output."""
    many = [{"kind": "thing", "ref": f"thing-{i}", "payload": payloads[i % len(payloads)]} for i in range(450)]
    harness.probe.answer = Answer(resources=many, output=payloads)

    async def body() -> None:
        run = await harness.start(one_step({}, cleanup="manual"))
        [run] = await harness.settle(run)
        step = await harness.step(run, "make")
        assert (step.status, step.rejections, step.output) == ("succeeded", None, payloads)
        stored = {r.ref: r.payload for r in await harness.resources(run, "thing")}
        assert stored == {m["ref"]: m["payload"] for m in many}

    harness.run(body)


def test_a_late_resource_never_walks_a_clean_run_back_to_pending(harness: Harness) -> None:
    """Rule 6 / §2: the move to dirty happens only from `not_required`. A resource
    reported after the run's cleanup completed is refused (the module reverts it itself),
    so the run stays `complete` with nothing live behind the verdict; a human's "clean up
    again" still finds nothing to do."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [THING]}))
        [run] = await harness.settle(run)
        assert run.cleanup_status == "complete"
        step = await harness.step(run, "make")
        with pytest.raises(InvalidState, match="revert these yourself"):
            await harness.store.record_late_resources(step, [NewResource("thing", "summoned")], harness.clock.now())
        run = await harness.get_run(run)
        assert run.cleanup_status == "complete"
        assert [r for r in await harness.resources(run, "thing") if r.ref == "summoned"] == []
        report = await harness.engine.clean_up(run.id, actor="ops", again=True)
        assert (report.status, report.reverted) == ("complete", 0)

    harness.run(body)


def test_the_first_resource_marks_the_run_dirty(harness: Harness) -> None:
    """Rule 6: a run is `not_required` until something is ledgered, then `pending`."""

    async def body() -> None:
        run = await harness.start(one_step({"answer": [THING]}, cleanup="manual"))
        assert run.cleanup_status == "not_required"
        [run] = await harness.settle(run)
        assert run.cleanup_status == "pending"

    harness.run(body)


def test_owner_is_the_actions_module_and_core_for_leases(harness: Harness) -> None:
    """Rule 7: rows a module's action made are owned by that module; a lease's row by
    `core`, whichever module registers the lease."""
    event = """
id: owners
cleanup: manual
phases:
  - name: only
    steps:
      - action: probe.make
        with: {answer: [{kind: thing, ref: t}]}
      - action: sandbox.spawn
        with: {kind: orc, region: britain}
      - action: core.lease
        with: {lease: probe.dial, value: 2}
"""

    async def body() -> None:
        run = await harness.start(event)
        await harness.settle(run)
        owners = {(r.kind, r.owner) for r in await harness.resources(run)}
        assert owners == {("@step", "probe"), ("thing", "probe"), ("@step", "sandbox"), ("creature", "sandbox")} | {
            ("override", "core")
        }

    harness.run(body)


def test_a_lease_row_is_reserved_with_its_saved_value_before_the_world_is_written(harness: Harness) -> None:
    """Rule 3: by the time the lease's writer is called, the committed override row
    exists and already holds the value it is about to overwrite."""
    seen: list[list[tuple[str, str, str, str | None]]] = []

    async def look(call: Any, value: Any) -> None:
        r = tables.run_resources.c
        seen.append(await harness.peek(r.owner, r.kind, r.ref, r.state, r.payload))

    harness.probe.observe_dial = look
    harness.probe.dial = 1.5
    event = """
id: dial
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        with: {lease: probe.dial, value: 4}
"""

    async def body() -> None:
        run = await harness.start(event)
        await harness.settle(run)
        assert seen == [[("core", "override", "probe.dial", "pending", {"saved": 1.5})]]
        [row] = await harness.resources(run)
        assert row.state == "live"

    harness.run(body)


def test_a_second_borrow_of_a_target_is_refused_before_the_world_is_written(harness: Harness) -> None:
    """Rule 3: a run borrowing a target another run holds fails with "held by run N",
    and the world keeps the first run's value: the second writer never ran. (Forced past
    pre-flight, which would refuse its start: the ledger still refuses it at dispatch.)"""

    def storm(value: str) -> str:
        return f"""
id: weather-{value}
cleanup: auto
duration: 1h
phases:
  - name: only
    steps:
      - action: core.lease
        name: sky
        with: {{lease: sandbox.weather, target: britain, value: {value}}}
"""

    async def body() -> None:
        first = await harness.start(storm("storm"))
        await harness.engine.tick()
        assert harness.world.read_weather("britain") == "storm"
        second = await harness.start(storm("fog"), force=True)
        [second] = await harness.settle(second)
        step = await harness.step(second, "sky")
        assert (second.status, step.status) == ("failed", "failed")
        assert step.error == f"sandbox.weather#britain is already held by run {first.id}"
        assert harness.world.read_weather("britain") == "storm"
        assert await harness.resources(second) == []
        [held] = await harness.resources(first)
        assert (held.state, held.payload) == ("live", {"saved": "clear"})

    harness.run(body)


def test_two_borrows_of_one_target_in_one_phase_share_its_row(harness: Harness) -> None:
    """Rule 3 within one run: two steps of a phase borrowing the same target are claimed
    together; both use the one row (neither fails for want of it), and cleanup gives
    back the value from before the first borrow."""
    event = """
id: twice
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: britain, value: storm}
        retry: {attempts: 1}
      - action: core.lease
        name: fog
        with: {lease: sandbox.weather, target: britain, value: fog}
        retry: {attempts: 1}
"""

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        assert [(s.status, s.attempts, s.error) for s in await harness.steps(run)] == [("succeeded", 1, None)] * 2
        [row] = await harness.resources(run)
        assert (row.state, row.payload) == ("live", {"saved": "clear"})
        report = await harness.engine.clean_up(run.id, actor="ops")
        assert (report.status, report.restored) == ("complete", 1)
        assert harness.world.read_weather("britain") == "clear"

    harness.run(body)


def test_a_later_borrow_never_saves_the_earlier_borrowed_value(harness: Harness) -> None:
    """Rule 3, the race: when a second borrow of a shared row reads the target after the
    first borrow wrote it, it reads a borrowed value; the row keeps the first saved value,
    so cleanup restores what the world held before the run."""
    both_reading, first_written = asyncio.Event(), asyncio.Event()
    readers: list[int] = []

    async def on_read(call: Any) -> None:
        readers.append(len(readers))
        if len(readers) == 1:  # the first borrow reads once the second has seen an unsaved row
            await asyncio.wait_for(both_reading.wait(), 5)
        else:  # and the second reads only after the first has written its value
            both_reading.set()
            await asyncio.wait_for(first_written.wait(), 5)

    async def on_write(call: Any, value: Any) -> None:
        first_written.set()

    harness.probe.observe_dial_read, harness.probe.observe_dial = on_read, on_write
    harness.probe.dial = 1.0
    event = """
id: race
cleanup: manual
phases:
  - name: only
    steps:
      - action: core.lease
        with: {lease: probe.dial, value: 4}
        retry: {attempts: 1}
      - action: core.lease
        with: {lease: probe.dial, value: 5}
        retry: {attempts: 1}
"""

    async def body() -> None:
        run = await harness.start(event)
        [run] = await harness.settle(run)
        assert [s.status for s in await harness.steps(run)] == ["succeeded", "succeeded"]
        assert readers == [0, 1]
        [row] = await harness.resources(run)
        assert row.payload == {"saved": 1.0}
        await harness.engine.clean_up(run.id, actor="ops")
        assert harness.probe.dial == 1.0

    harness.run(body)

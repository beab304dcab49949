"""Who owns a queued call (DESIGN §11): each delivery carries a token minted by its take and
only an answer naming the delivery in hand is kept; a call whose caller gave up is
withdrawn, never handed out again, and its late answer is refused with the reason; and a
caller waits on an offline module no longer than its deadline, on the injectable clock."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from roadie import protocol
from roadie.errors import StepTimeout
from roadie.registry import LeaseCall, RevertCall
from roadie.remote.client import RemoteModule
from roadie.remote.gateway import Gateway
from roadie.remote.queue import PullTransport, WorkQueue
from roadie.store.queue import QueueStore
from tests.conftest import Harness

SECRET = "s3cret-for-tests"
BODY = {"action": "spawn", "run_id": 1, "step_id": 2, "idempotency_key": "k-1", "attempt": 1, "params": {}, "fence": 1}
DRIVEN_POLL = 0.2
"""How often a queue whose waits the fake clock drives (`Harness.drive`) looks at the
database: a few times a second, not a hundred. The clock moves only while no database call
is under way, and at 0.01 s there nearly always was one, so a deadline was sometimes never
reached (a full run failed on it, and 1 run in 3 of one such test alone)."""


def _signed(path: str, body: dict[str, Any], *, tokens: bool = False) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    headers = protocol.sign(SECRET, "POST", path, raw, module="lua")
    if tokens:
        headers[protocol.H_FEATURES] = protocol.FEATURE_TOKENS
    return {"content": raw, "headers": headers}


def test_a_withdrawn_call_is_not_handed_out_again_and_its_late_answer_is_not_taken(harness: Harness) -> None:
    """Withdrawn while a module holds it, a call is never handed out again, the module's
    late answer is refused with the reason, and no caller can read it. A retry under the
    same key queues it afresh, under a new delivery token."""

    async def body() -> None:
        calls = QueueStore(harness.store)
        call_id = await calls.enqueue("lua", "dispatch", "k-1", BODY, harness.clock.now())
        [held] = await calls.take("lua", 10, harness.clock.now(), visibility=30)
        assert held.token

        assert await calls.withdraw(call_id, harness.clock.now(), "no answer within 60s")
        assert not await calls.withdraw(call_id, harness.clock.now(), "twice")  # fenced: once
        harness.clock.advance(31)  # past its visibility: it would have been handed out again
        assert await calls.take("lua", 10, harness.clock.now(), visibility=30) == []
        assert await calls.waiting("lua", harness.clock.now()) == 0

        late = await calls.answer("lua", call_id, 200, {"resources": []}, harness.clock.now(), held.token)
        assert not late.accepted
        assert "withdrawn: no answer within 60s" in late.reason
        assert await calls.answers([call_id]) == {}

        # The step is retried: the same call, queued afresh; the old delivery names nothing.
        assert await calls.enqueue("lua", "dispatch", "k-1", {**BODY, "attempt": 2}, harness.clock.now()) == call_id
        [again] = await calls.take("lua", 10, harness.clock.now(), visibility=30)
        assert again.token != held.token
        stale = await calls.answer("lua", call_id, 200, {"old": True}, harness.clock.now(), held.token)
        assert not stale.accepted
        assert "stale delivery" in stale.reason
        assert await calls.answer("lua", call_id, 200, {"resources": []}, harness.clock.now(), again.token)
        assert await calls.answers([call_id]) == {call_id: (200, {"resources": []})}

    harness.run(body)


def test_only_the_delivery_in_hand_may_answer(harness: Harness) -> None:
    """A call handed out again after its visibility has a new token: the first delivery's
    answer is refused, the second's kept. An answer naming no token (a module older than
    tokens) is kept only for a call that was handed out and is still wanted."""

    async def body() -> None:
        calls = QueueStore(harness.store)
        first_id = await calls.enqueue("lua", "dispatch", "k-1", BODY, harness.clock.now())
        [first] = await calls.take("lua", 10, harness.clock.now(), visibility=30)
        harness.clock.advance(31)
        [second] = await calls.take("lua", 10, harness.clock.now(), visibility=30)
        assert (first.id, second.id, second.deliveries) == (first_id, first_id, 2)
        assert first.token != second.token

        refused = await calls.answer("lua", first_id, 200, {"first": True}, harness.clock.now(), first.token)
        assert not refused.accepted
        assert "stale delivery" in refused.reason
        assert await calls.answer("lua", first_id, 200, {"second": True}, harness.clock.now(), second.token)
        assert await calls.answers([first_id]) == {first_id: (200, {"second": True})}

        other = await calls.enqueue("lua", "dispatch", "k-2", {**BODY, "idempotency_key": "k-2"}, harness.clock.now())
        never = await calls.answer("lua", other, 200, {}, harness.clock.now())
        assert (never.accepted, never.reason) == (False, "the call was never handed out")
        await calls.take("lua", 10, harness.clock.now(), visibility=30)
        assert await calls.answer("lua", other, 200, {}, harness.clock.now())

    harness.run(body)


def test_a_module_that_announces_again_gets_the_calls_its_last_process_held_at_once(harness: Harness) -> None:
    """A restarted module announces: what its dead process held is due again at once, not
    after the visibility timeout; the old delivery's answer is refused once it is."""

    async def body() -> None:
        calls = QueueStore(harness.store)
        held_id = await calls.enqueue("lua", "dispatch", "k-1", BODY, harness.clock.now())
        other = await calls.enqueue("other", "dispatch", "k-2", {**BODY, "idempotency_key": "k-2"}, harness.clock.now())
        [held] = await calls.take("lua", 10, harness.clock.now(), visibility=30)
        [theirs] = await calls.take("other", 10, harness.clock.now(), visibility=30)
        assert await calls.take("lua", 10, harness.clock.now(), visibility=30) == []

        await calls.announce("lua", {"module": "lua"}, harness.clock.now())
        [again] = await calls.take("lua", 10, harness.clock.now(), visibility=30)
        assert (again.id, again.deliveries) == (held_id, 2)
        assert await calls.take("other", 10, harness.clock.now(), visibility=30) == []  # another module's stay
        stale = await calls.answer("lua", held_id, 200, {"old": True}, harness.clock.now(), held.token)
        assert "stale delivery" in stale.reason
        assert await calls.answer("lua", held_id, 200, {"resources": []}, harness.clock.now(), again.token)
        assert await calls.answer("other", other, 200, {"resources": []}, harness.clock.now(), theirs.token)

    harness.run(body)


def test_the_gateway_gives_tokens_to_polls_that_ask_and_refuses_late_answers(harness: Harness) -> None:
    """A poll that asks for delivery tokens gets one per call (others get the calls as
    before, without the field); an answer for a call whose caller gave up is refused,
    with the reason, and the caller never sees it."""

    async def body() -> None:
        queue = WorkQueue(harness.store, clock=harness.clock, poll_interval=DRIVEN_POLL, deadline=60)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            caller = asyncio.ensure_future(queue.submit("lua", "dispatch", "k-1", BODY))
            pulled = await client.post(protocol.PULL, **_signed(protocol.PULL, {"max": 4, "wait": 2}, tokens=True))
            [call] = protocol.PullAnswer.model_validate(pulled.json()).calls
            assert call.token

            with pytest.raises(StepTimeout):
                await harness.drive(caller, limit=300)
            answer = {"id": call.id, "status": 200, "body": {"resources": []}, "token": call.token}
            posted = await client.post(protocol.ANSWER, **_signed(protocol.ANSWER, answer))
            assert posted.status_code == 200
            assert posted.json()["accepted"] is False
            assert "withdrawn" in posted.json()["reason"]
            assert await queue.calls.answers([call.id]) == {}

            # A poll that did not ask gets no token field: an older module refuses fields it does not know.
            second = asyncio.ensure_future(queue.submit("lua", "dispatch", "k-2", {**BODY, "idempotency_key": "k-2"}))
            plain = await client.post(protocol.PULL, **_signed(protocol.PULL, {"max": 4, "wait": 2}))
            assert [set(c) for c in plain.json()["calls"]] == [
                {"id", "kind", "path", "idempotency_key", "body", "delivery"}
            ]
            [old] = plain.json()["calls"]
            posted = await client.post(protocol.ANSWER, **_signed(protocol.ANSWER, {"id": old["id"], "status": 200}))
            assert posted.json() == {"accepted": True}
            assert await harness.drive(second, limit=300) == (200, None)

    harness.run(body)


def test_a_queued_call_nobody_takes_ends_at_its_deadline_and_is_withdrawn(harness: Harness) -> None:
    """The module is offline: a lease restore submitted to the queue raises a retryable
    StepTimeout once the queue's deadline (60 s by default) has passed on the fake clock,
    instead of waiting for ever, and the call is withdrawn."""

    async def body() -> None:
        queue = WorkQueue(harness.store, clock=harness.clock, poll_interval=DRIVEN_POLL)
        restore = {
            "lease": "weather", "target": "britain", "run_id": 7, "idempotency_key": "restore-7-12", "value": "clear",
            "fence": 1,
        }  # fmt: skip
        started = harness.clock.now()
        with pytest.raises(StepTimeout) as raised:
            await harness.drive(queue.submit("lua", "lease.restore", "restore-7-12", restore), limit=300)
        assert raised.value.retryable
        assert (harness.clock.now() - started).total_seconds() >= 60
        harness.clock.advance(3600)
        assert await queue.calls.take("lua", 10, harness.clock.now(), visibility=30) == []

    harness.run(body)


def test_an_offline_pull_module_times_out_a_restore_and_a_revert_and_withdraws_them(harness: Harness) -> None:
    """Nobody polls: a lease restore and a revert submitted to the queue raise a retryable
    StepTimeout once the deadline has passed on the (fake) clock, instead of holding the
    worker for ever, and their calls are withdrawn: a module polling later gets nothing."""

    async def body() -> None:
        queue = WorkQueue(harness.store, clock=harness.clock, poll_interval=DRIVEN_POLL)
        manifest = protocol.Manifest(
            module="lua",
            actions=[protocol.ActionSpec(name="spawn", reversible="ledger")],
            leases=[protocol.LeaseSpec(name="weather", targeted=True)],
        )
        module = RemoteModule(manifest, PullTransport("lua", queue, deadline=30), clock=harness.clock).build()
        lease = module.leases["weather"]
        assert lease.restore_fn is not None
        restore = LeaseCall("weather", "britain", None, harness.clock, idempotency_key="restore-7-12", run_id=7)
        started = harness.clock.now()
        with pytest.raises(StepTimeout) as raised:
            await harness.drive(lease.restore_fn(restore, "clear"), limit=300)
        assert raised.value.retryable
        assert (harness.clock.now() - started).total_seconds() >= 30

        revert_fn = module.actions["spawn"].revert_fn
        assert revert_fn is not None
        revert = RevertCall(run_id=7, idempotency_key="k-spawn", resources=[], state=None, clock=harness.clock)
        with pytest.raises(StepTimeout):
            await harness.drive(revert_fn(revert), limit=300)

        harness.clock.advance(3600)
        assert await queue.calls.take("lua", 10, harness.clock.now(), visibility=30) == []

    harness.run(body)


def test_a_cancelled_caller_withdraws_its_call(harness: Harness) -> None:
    """The step or cleanup that waited ended (its task cancelled): the call is withdrawn,
    so no module carries it out after nobody wants it."""

    async def body() -> None:
        queue = WorkQueue(harness.store, clock=harness.clock, poll_interval=0.01)
        caller = asyncio.ensure_future(queue.submit("lua", "lease.apply", "k-1", {"lease": "weather"}))
        while await queue.calls.waiting("lua", harness.clock.now()) == 0:
            await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert await queue.calls.take("lua", 10, harness.clock.now(), visibility=30) == []

    harness.run(body)

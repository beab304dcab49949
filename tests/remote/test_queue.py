"""The pull transport's work queue and the gateway, on every database: a call is handed out
once per visibility timeout, the same call made again is the same work, an answer reaches
its caller once, and every request to the gateway is signed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from roadie import protocol
from roadie.remote.gateway import Gateway
from roadie.remote.queue import WorkQueue
from roadie.store.queue import QueueStore
from tests.conftest import Harness

SECRET = "s3cret-for-tests"
BODY = {"action": "spawn", "run_id": 1, "step_id": 2, "idempotency_key": "k-1", "attempt": 1, "params": {}, "fence": 1}


def test_a_call_is_handed_out_once_per_visibility(harness: Harness) -> None:
    async def body() -> None:
        calls = QueueStore(harness.store)
        now = harness.clock.now()
        first = await calls.enqueue("lua", "dispatch", "k-1", BODY, now)
        # The step retried: another attempt of the same call is the same row.
        assert await calls.enqueue("lua", "dispatch", "k-1", {**BODY, "attempt": 2}, now) == first
        other = await calls.enqueue("lua", "dispatch", "k-2", {**BODY, "idempotency_key": "k-2"}, now)
        assert other != first

        taken = await calls.take("lua", 10, now, visibility=30)
        assert [(c.id, c.deliveries) for c in taken] == [(first, 1), (other, 1)]
        assert await calls.take("lua", 10, now, visibility=30) == []  # hidden while being worked on
        assert await calls.take("other-module", 10, now, visibility=30) == []

        harness.clock.advance(31)  # never answered: handed out again, under the same key
        again = await calls.take("lua", 1, harness.clock.now(), visibility=30)
        assert [(c.id, c.idempotency_key, c.deliveries) for c in again] == [(first, "k-1", 2)]

        assert await calls.answer("lua", first, 200, {"resources": []}, harness.clock.now())
        assert not await calls.answer("lua", first, 200, {"late": True}, harness.clock.now())  # once
        assert not await calls.answer("intruder", other, 200, {}, harness.clock.now())  # not its call
        assert await calls.answers([first, other]) == {first: (200, {"resources": []})}
        await calls.consume([first, other])
        assert await calls.answers([first]) == {}
        harness.clock.advance(31)
        assert [c.id for c in await calls.take("lua", 10, harness.clock.now(), 30)] == [other]

    harness.run(body)


def test_two_pollers_never_share_a_call(harness: Harness) -> None:
    async def body() -> None:
        calls = QueueStore(harness.store)
        now = harness.clock.now()
        for i in range(40):
            await calls.enqueue("lua", "dispatch", f"k-{i}", {**BODY, "idempotency_key": f"k-{i}"}, now)
        ids: list[int] = []
        for _ in range(20):  # a poller may find rows locked by another and get fewer: it looks again
            batches = await asyncio.gather(*(calls.take("lua", 7, now, 30) for _ in range(8)))
            ids.extend(c.id for batch in batches for c in batch)
            if len(ids) >= 40:
                break
        assert len(ids) == len(set(ids)) == 40

    harness.run(body)


def _signed(path: str, body: dict[str, Any], *, module: str = "lua", secret: str = SECRET) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    return {"content": raw, "headers": protocol.sign(secret, "POST", path, raw, module=module)}


def test_the_gateway_carries_a_call_and_its_answer(harness: Harness) -> None:
    async def body() -> None:
        queue = WorkQueue(harness.store, poll_interval=0.01)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            caller = asyncio.create_task(queue.submit("lua", "dispatch", "k-1", BODY))
            pulled = await client.post(protocol.PULL, **_signed(protocol.PULL, {"max": 4, "wait": 2}))
            assert pulled.status_code == 200, pulled.text
            [call] = protocol.PullAnswer.model_validate(pulled.json()).calls
            assert (call.kind, call.path, call.idempotency_key, call.delivery) == (
                "dispatch",
                protocol.DISPATCH,
                "k-1",
                1,
            )
            assert call.body == BODY
            answer = {"id": call.id, "status": 200, "body": {"resources": [{"kind": "creature", "ref": "0x1"}]}}
            posted = await client.post(protocol.ANSWER, **_signed(protocol.ANSWER, answer))
            assert posted.json() == {"accepted": True}
            assert await asyncio.wait_for(caller, 5) == (200, answer["body"])

    harness.run(body)


def test_a_poll_that_asks_gets_its_answer_signed_inside_the_body(harness: Harness) -> None:
    """For clients that show no response headers (Luanti's): the answer's text and its
    signature in one body; the text is ASCII, so whatever decodes the body gives back
    the very bytes that were signed, though the calls carry any unicode."""
    unicode_body = {**BODY, "params": {"message": 'Ærø 🐉 \u2028 "quoted"'}}

    async def body() -> None:
        queue = WorkQueue(harness.store, poll_interval=0.01)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            caller = asyncio.create_task(queue.submit("lua", "dispatch", "k-1", unicode_body))
            poll = _signed(protocol.PULL, {"max": 4, "wait": 2})
            poll["headers"][protocol.H_FEATURES] = "Delivery-Token, signed-body"
            pulled = await client.post(protocol.PULL, **poll)
            assert pulled.status_code == 200, pulled.text
            assert protocol.H_SIGNATURE not in pulled.headers
            envelope = pulled.json()
            assert envelope["answer"].isascii()
            poll_id = poll["headers"][protocol.H_ID]
            opened = protocol.open_signed_body(SECRET, poll_id, protocol.PULL, pulled.content)
            [call] = protocol.PullAnswer.model_validate_json(opened).calls
            assert call.body == unicode_body
            assert call.token

            mark = envelope["signature"][10]
            changed = envelope["signature"][:10] + ("B" if mark == "A" else "A") + envelope["signature"][11:]
            for refused in (
                {**envelope, "answer": envelope["answer"].replace("k-1", "k-2")},
                {**envelope, "signature": changed},  # one character changed, whichever it was
                {"calls": []},
            ):
                with pytest.raises(protocol.SignatureRefused):
                    protocol.open_signed_body(SECRET, poll_id, protocol.PULL, json.dumps(refused).encode())
            with pytest.raises(protocol.SignatureRefused, match="wrong signature"):
                protocol.open_signed_body("another secret", poll_id, protocol.PULL, pulled.content)
            with pytest.raises(protocol.SignatureRefused, match="stale"):
                protocol.open_signed_body(SECRET, poll_id, protocol.PULL, pulled.content, now=0)
            # Recorded and replayed to another poll of the module's: refused.
            with pytest.raises(protocol.SignatureRefused, match="another request"):
                protocol.open_signed_body(SECRET, protocol.new_id(), protocol.PULL, pulled.content)
            answer = {"id": call.id, "status": 200, "body": {"resources": []}, "token": call.token}
            assert (await client.post(protocol.ANSWER, **_signed(protocol.ANSWER, answer))).json()["accepted"]
            assert await asyncio.wait_for(caller, 5) == (200, {"resources": []})

    harness.run(body)


def test_a_poll_whose_module_hung_up_ends_and_hands_out_nothing(harness: Harness) -> None:
    """A module process that dies while its poll is held: the poll ends at once, instead of
    being handed the next call for nobody to read (lost until its visibility timeout)."""

    async def body() -> None:
        queue = WorkQueue(harness.store, poll_interval=0.01)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        raw = json.dumps({"max": 4, "wait": 30}).encode()
        headers = protocol.sign(SECRET, "POST", protocol.PULL, raw, module="lua")
        messages: list[dict[str, Any]] = [{"type": "http.request", "body": raw, "more_body": False}]
        hung_up = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await hung_up.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            return None

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": protocol.PULL, "raw_path": protocol.PULL.encode(), "query_string": b"",
            "root_path": "", "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 40000), "server": ("gw", 80),
        }  # fmt: skip
        polling = asyncio.create_task(app(scope, receive, send))
        hung_up.set()
        await asyncio.wait_for(polling, 10)  # not the poll's 30 s

        await QueueStore(harness.store).enqueue("lua", "dispatch", "k-1", BODY, harness.clock.now())
        [call] = await QueueStore(harness.store).take("lua", 4, harness.clock.now(), visibility=30)
        assert call.deliveries == 1  # the dead poll was handed nothing

    harness.run(body)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"headers": {}}, "unsigned"),
        ({"secret": "wrong"}, "wrong signature"),
        ({"module": "nobody"}, "no remote module 'nobody'"),
        ({"stale": True}, "stale"),
        ({"tamper": True}, "wrong signature"),
    ],
)
def test_the_gateway_refuses_what_is_not_signed_by_the_module(
    harness: Harness, change: dict[str, Any], expected: str
) -> None:
    async def body() -> None:
        queue = WorkQueue(harness.store)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        raw = json.dumps({"max": 1, "wait": 0}).encode()
        headers = protocol.sign(
            change.get("secret", SECRET),
            "POST",
            protocol.PULL,
            raw,
            module=change.get("module", "lua"),
            now=0 if change.get("stale") else None,
        )
        if "headers" in change:
            headers = {protocol.H_MODULE: "lua"}
        content = raw.replace(b"1", b"9") if change.get("tamper") else raw
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            response = await client.post(protocol.PULL, content=content, headers=headers)
        assert response.status_code == 401
        assert expected in response.json()["error"]["message"]

    harness.run(body)


def test_the_gateway_refuses_replayed_re_targeted_and_oversized_requests(harness: Harness) -> None:
    """A request captured on the wire and sent again, at once or to another path, is
    refused; so is one over the size limit, by its Content-Length, unread."""

    async def body() -> None:
        queue = WorkQueue(harness.store)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        report = {"idempotency_key": "k-nobody", "resources": [{"kind": "thing", "ref": "x"}]}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            captured = _signed(protocol.REPORT, report)
            first = await client.post(protocol.REPORT, **captured)
            assert first.status_code == 404, first.text  # signed and read: no such step
            again = await client.post(protocol.REPORT, **captured)
            assert again.status_code == 401
            assert "replayed" in again.json()["error"]["message"]
            elsewhere = _signed(protocol.REPORT, report)
            moved = await client.post(protocol.ANSWER, **elsewhere)
            assert moved.status_code == 401
            assert "wrong signature" in moved.json()["error"]["message"]
            # The id of the refused request was not kept: sent where it was signed for, it passes.
            assert (await client.post(protocol.REPORT, **elsewhere)).status_code == 404
            huge = b'{"idempotency_key": "' + b"k" * protocol.MAX_BODY_BYTES + b'"}'
            headers = protocol.sign(SECRET, "POST", protocol.REPORT, huge, module="lua")
            over = await client.post(protocol.REPORT, content=huge, headers=headers)
            assert over.status_code == 413
            assert "limit" in over.json()["error"]["message"]
            # Rotation: a module signing with a new and an old secret is let in by either.
            rotating = Gateway(harness.store, queue, {"lua": [f"whsec_{'A' * 43}=", SECRET]}, harness.registry)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rotating.app()), base_url="http://gw") as client:
            for secret in (SECRET, ["whsec_" + "A" * 43 + "=", "an unknown one"]):
                raw = json.dumps(report).encode()
                signed = protocol.sign(secret, "POST", protocol.REPORT, raw, module="lua")
                assert (await client.post(protocol.REPORT, content=raw, headers=signed)).status_code == 404

    harness.run(body)


def test_the_gateway_refuses_malformed_bodies_with_the_field(harness: Harness) -> None:
    async def body() -> None:
        queue = WorkQueue(harness.store)
        app = Gateway(harness.store, queue, {"lua": SECRET}, harness.registry).app()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            bad = await client.post(protocol.ANSWER, **_signed(protocol.ANSWER, {"id": "x", "status": 200}))
            assert bad.status_code == 400
            assert bad.json()["error"]["field"] == "id"
            raw = b"{not json"
            headers = protocol.sign(SECRET, "POST", protocol.PULL, raw, module="lua")
            broken = await client.post(protocol.PULL, content=raw, headers=headers)
            assert broken.status_code == 400

    harness.run(body)


LATE = """
id: late
cleanup: manual
phases:
  - name: only
    steps:
      - action: probe.make
        name: summoner
        with: {answer: [{kind: thing, ref: boss}]}
"""


def test_a_late_report_joins_the_ledger(harness: Harness) -> None:
    """What a step's effect made by itself is reported against its key, checked like any
    answer (a bad entry is rejected with its reason), and cleaned up with the rest."""

    async def body() -> None:
        run = await harness.start(LATE)
        await harness.settle(run)
        [step] = await harness.store.list_steps(run.id)
        queue = WorkQueue(harness.store)
        app = Gateway(harness.store, queue, {"probe": SECRET}, harness.registry).app()
        report = {
            "idempotency_key": step.idempotency_key,
            "resources": [{"kind": "thing", "ref": "minion"}, {"ref": ""}],
        }
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            answer = await client.post(protocol.REPORT, **_signed(protocol.REPORT, report, module="probe"))
            assert answer.status_code == 200, answer.text
            assert answer.json()["recorded"] == 1
            assert "bad kind" in answer.json()["rejected"][0]
            unknown = {"idempotency_key": "nope", "resources": [{"kind": "thing", "ref": "x"}]}
            missing = await client.post(protocol.REPORT, **_signed(protocol.REPORT, unknown, module="probe"))
            assert missing.status_code == 404
        live = {r.ref for r in await harness.store.list_resources(run.id, live_only=True)}
        assert {"boss", "minion"} <= live
        cleaned = await harness.engine.clean_up(run.id)
        assert cleaned.status == "complete"
        assert {"boss", "minion"} <= {r.ref for c in harness.probe.reverts for r in c.resources}

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            after = await client.post(protocol.REPORT, **_signed(protocol.REPORT, report, module="probe"))
            assert after.status_code == 409  # its cleanup is over: it would be missed

    harness.run(body)

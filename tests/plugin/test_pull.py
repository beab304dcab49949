"""Pull mode against a small fake gateway: the module announces itself, long-polls for
calls, handles them with the push server's code (same key ledger, same statuses) and
posts the answers back; late reports are signed and kept in the key ledger."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from roadie import protocol
from roadie.modules import sandbox
from roadie.plugin import Faults, ModuleServer, PullClient
from tests.plugin.helpers import SECRET, dispatch_body, revert_body

ENGINE = "http://engine"


class FakeGateway:
    """The engine's side of pull, just enough of it: a queue of calls, the answers posted,
    the announcements and reports; every request must be signed as module `sandbox`."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue[protocol.PulledCall] = asyncio.Queue()
        self.answers: dict[int, list[protocol.AnswerPost]] = {}
        self.announced: list[protocol.Manifest] = []
        self.reports: list[protocol.ReportRequest] = []
        self.refused: list[str] = []
        self.answered = asyncio.Event()
        self.signing_secret: str | None = SECRET  # what it signs its poll answers with; None: unsigned
        self._ids = 0
        self.app = Starlette(
            routes=[
                Route(protocol.ANNOUNCE, self.announce, methods=["POST"]),
                Route(protocol.PULL, self.pull, methods=["POST"]),
                Route(protocol.ANSWER, self.answer, methods=["POST"]),
                Route(protocol.REPORT, self.report, methods=["POST"]),
            ]
        )

    def put(self, kind: protocol.CallKind, body: dict[str, Any], *, delivery: int = 1, id: int | None = None) -> int:
        if id is None:
            self._ids += 1
            id = self._ids
        self.calls.put_nowait(
            protocol.PulledCall(
                id=id,
                kind=kind,
                path=protocol.CALL_PATHS[kind],
                idempotency_key=body["idempotency_key"],
                body=body,
                delivery=delivery,
            )
        )
        return id

    async def _verified(self, request: Request) -> bytes:
        body = await request.body()
        assert request.headers[protocol.H_MODULE] == "sandbox"
        try:
            protocol.verify(SECRET, request.method, request.url.path, request.headers, body)
        except protocol.SignatureRefused as exc:
            self.refused.append(exc.message)
            raise
        return body

    async def announce(self, request: Request) -> JSONResponse:
        self.announced.append(protocol.Manifest.model_validate_json(await self._verified(request)))
        return JSONResponse({"announced": "sandbox"})

    async def pull(self, request: Request) -> Response:
        wanted = protocol.PullRequest.model_validate_json(await self._verified(request))
        taken: list[protocol.PulledCall] = []
        with contextlib.suppress(TimeoutError):
            taken.append(await asyncio.wait_for(self.calls.get(), wanted.wait))
        while taken and len(taken) < wanted.max and not self.calls.empty():
            taken.append(self.calls.get_nowait())
        raw = protocol.PullAnswer(calls=taken).model_dump_json().encode()
        request_id = request.headers[protocol.H_ID]
        headers = (
            protocol.sign_answer(self.signing_secret, request_id, protocol.PULL, raw) if self.signing_secret else {}
        )
        return Response(raw, media_type="application/json", headers=headers)

    async def answer(self, request: Request) -> JSONResponse:
        posted = protocol.AnswerPost.model_validate_json(await self._verified(request))
        self.answers.setdefault(posted.id, []).append(posted)
        self.answered.set()
        return JSONResponse({"accepted": True})

    async def report(self, request: Request) -> JSONResponse:
        report = protocol.ReportRequest.model_validate_json(await self._verified(request))
        assert request.headers[protocol.H_KEY] == report.idempotency_key
        self.reports.append(report)
        return JSONResponse(protocol.ReportAnswer(recorded=len(report.resources)).model_dump())

    async def wait_answers(self, *ids: int) -> None:
        async with asyncio.timeout(10.0):
            while not all(i in self.answers for i in ids):
                self.answered.clear()
                await self.answered.wait()


class Flaky(httpx.AsyncBaseTransport):
    """The first `failures` requests cannot connect; then it is the gateway."""

    def __init__(self, app: Starlette, failures: int) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.failures = failures
        self.seen = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        if self.seen <= self.failures:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)


def _client(home: Path, http: httpx.AsyncClient, **kw: Any) -> PullClient:
    return PullClient(
        sandbox.module,
        ENGINE,
        SECRET,
        str(home / "keys.db"),
        settings={"db": "world.db"},
        base_dir=str(home),
        wait=0.2,
        backoff=0.01,
        http=http,
        **kw,
    )


def test_pull_client_announces_pulls_and_answers_exactly_once(tmp_path: Path) -> None:
    """Across two connection failures, the client announces its manifest, answers a
    dispatch and its redelivery with one answer and one effect, a malformed call with the
    push server's status, a lease read, then a revert by key alone; stop() ends it."""

    async def body() -> None:
        gateway = FakeGateway()
        flaky = Flaky(gateway.app, failures=2)
        async with httpx.AsyncClient(transport=flaky) as http:
            client = _client(tmp_path, http)
            running = asyncio.create_task(client.run())
            await asyncio.wait_for(client.announced.wait(), 10)
            assert [m.module for m in gateway.announced] == ["sandbox"]
            assert {a.name for a in gateway.announced[0].actions} >= {"spawn", "broadcast"}

            first = gateway.put("dispatch", dispatch_body("k1"))
            again = gateway.put("dispatch", dispatch_body("k1", attempt=2), delivery=2)
            unknown = gateway.put("dispatch", dispatch_body("k2", action="teleport"))
            lease = gateway.put(
                "lease.read", {"lease": "weather", "target": "yew", "run_id": 1, "idempotency_key": "lk"}
            )
            await gateway.wait_answers(first, again, unknown, lease)
            [one], [two] = gateway.answers[first], gateway.answers[again]
            assert one.status == two.status == 200
            assert one.body == two.body
            assert gateway.answers[unknown][0].status == 404
            assert gateway.answers[lease][0].body == {"value": "clear"}
            world = client.server.state
            assert len([e for e in world.effects() if e["op"] == "create"]) == 2

            reverted = gateway.put("revert", revert_body("k1"))
            await gateway.wait_answers(reverted)
            assert gateway.answers[reverted][0].status == 200
            assert world.snapshot()["creatures"] == {}

            client.stop()
            await asyncio.wait_for(running, 10)
        assert flaky.seen > 2
        assert gateway.refused == []

    asyncio.run(body())


def test_pull_lost_answer_is_acted_and_stored_but_not_posted(tmp_path: Path) -> None:
    async def body() -> None:
        gateway = FakeGateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            client = _client(tmp_path, http, faults=Faults(lose_answers=1.0))
            running = asyncio.create_task(client.run())
            gateway.put("dispatch", dispatch_body("k1"))
            async with asyncio.timeout(10):
                while client.handled < 1:
                    await asyncio.sleep(0.01)
            entry = client.server.ledger.entry("k1")
            assert entry is not None
            assert entry.answer is not None
            assert gateway.answers == {}
            client.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(body())


def test_report_is_signed_kept_and_reverted_by_key(tmp_path: Path) -> None:
    """A late resource is POSTed signed to the engine and kept in the key ledger, so a
    revert by key alone takes it back down with what the dispatch answered."""

    async def body() -> None:
        gateway = FakeGateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            server = ModuleServer(
                sandbox.module,
                secret=SECRET,
                ledger_path=str(tmp_path / "keys.db"),
                settings={"db": "world.db"},
                base_dir=str(tmp_path),
                engine_url=ENGINE,
                http=http,
            )
            async with server:
                reply = await server.handle("dispatch", json.dumps(dispatch_body("k1")).encode())
                assert reply.status == 200
                world = server.state
                world.reuse_serial("0x50000000", "imp", "britain", tag="k1")  # it summoned an imp
                answer = await server.report("k1", [{"kind": "creature", "ref": "0x50000000"}])
                assert answer.recorded == 1
                [report] = gateway.reports
                assert report.idempotency_key == "k1"
                assert report.resources[0]["ref"] == "0x50000000"
                assert server.ledger.late("k1") == [{"kind": "creature", "ref": "0x50000000"}]
                reverted = await server.handle("revert", json.dumps(revert_body("k1")).encode())
                assert reverted.status == 200
                assert world.snapshot()["creatures"] == {}

    asyncio.run(body())


@pytest.mark.parametrize("secret", [None, "not-the-modules-secret"], ids=["unsigned", "wrongly-signed"])
def test_pull_client_carries_out_no_work_the_engine_did_not_sign(tmp_path: Path, secret: str | None) -> None:
    """Work handed out in a poll's answer is the engine's word: one not signed with the
    module's secret (a man in the middle, a wrong gateway) is not carried out."""

    async def body() -> None:
        gateway = FakeGateway()
        gateway.signing_secret = secret
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            client = _client(tmp_path, http)
            running = asyncio.create_task(client.run())
            await asyncio.wait_for(client.announced.wait(), 10)
            gateway.put("dispatch", dispatch_body("forged"))
            await asyncio.sleep(1.0)
            assert client.handled == 0
            assert [e for e in client.server.state.effects() if e["op"] == "create"] == []
            client.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(body())

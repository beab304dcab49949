"""The engine's HTTP side of the protocol: what modules call (docs/protocol.md).

- `POST /roadie/v2/announce`: a polling module says what it is (its manifest).
- `POST /roadie/v2/pull`: a polling module long-polls for calls.
- `POST /roadie/v2/answer`: it posts a call's answer back.
- `POST /roadie/v2/report`: any module reports resources a step's effect made by itself.

Every request is signed with the calling module's secret, under an id it never sent
before, and names the module in `X-Roadie-Module`; anything else is refused with 401 (a
request naming no module of ours before its body is read), and a body over
`protocol.MAX_BODY_BYTES` with 413.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from roadie.engine.ledger import normalise
from roadie.errors import InvalidState
from roadie.log import get_logger
from roadie.registry import Registry
from roadie.remote import protocol
from roadie.remote.queue import WorkQueue
from roadie.states import CleanupStatus, Reversible
from roadie.store import NewResource
from roadie.store.queue import QueuedCall
from roadie.store.store import Store

log = get_logger(__name__)


class _Refused(Exception):
    def __init__(self, status: int, message: str, field: str | None = None, *, retryable: bool = False) -> None:
        self.status = status
        self.message = message
        self.field = field
        self.retryable = retryable


def _error(status: int, message: str, field: str | None = None, *, retryable: bool = False) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, field=field, retryable=retryable), status_code=status)


class Gateway:
    """The routes, over one store, one work queue, and the modules' secrets."""

    def __init__(
        self,
        store: Store,
        queue: WorkQueue,
        secrets: Mapping[str, protocol.Secrets],
        registry: Registry,
        *,
        max_skew: float = protocol.MAX_SKEW,
        on_announce: Callable[[protocol.Manifest], None] | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.secrets = secrets  # kept as given: a mapping may answer for names it learns later
        self.registry = registry
        self.max_skew = max_skew
        self.on_announce = on_announce

    async def _verified(self, request: Request) -> tuple[str, bytes, str]:
        """The calling module, the request's body and its id, once its signature is checked
        and its id was never seen before; refused (401, 413) otherwise, the body unread
        when its module or size is wrong."""
        module = request.headers.get(protocol.H_MODULE, "")
        if not module:
            raise _Refused(401, f"no {protocol.H_MODULE} header: say which module is calling")
        secret = self.secrets.get(module)
        if secret is None:
            raise _Refused(401, f"no remote module {module!r} is configured here")
        body = await protocol.read_capped(request.stream(), request.headers.get("content-length"))
        if body is None:
            raise _Refused(413, f"request body over the limit of {protocol.MAX_BODY_BYTES} bytes")
        now = time.time()
        try:
            signed = protocol.verify(
                secret, request.method, request.url.path, request.headers, body, max_skew=self.max_skew, now=now
            )
        except protocol.SignatureRefused as exc:
            raise _Refused(401, exc.message) from exc
        kept_until = datetime.fromtimestamp(signed.sent + self.max_skew, UTC)
        if not await self.queue.calls.first_sight(module, signed.id, kept_until, datetime.fromtimestamp(now, UTC)):
            raise _Refused(401, protocol.REPLAYED)
        return module, body, signed.id

    @staticmethod
    def _parse(model: type[Any], body: bytes) -> Any:
        try:
            return model.model_validate_json(body or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            raise _Refused(400, f"malformed request: {first['msg']}", field) from exc

    async def announce(self, request: Request) -> Any:
        module, body, _ = await self._verified(request)
        manifest = self._parse(protocol.Manifest, body)
        if manifest.module != module:
            raise _Refused(400, f"signed as module {module!r} but announces {manifest.module!r}", "module")
        await self.queue.calls.announce(module, manifest.model_dump(mode="json"), self.queue.now())
        if self.on_announce is not None:
            try:
                self.on_announce(manifest)
            except Exception as exc:  # a manifest this process cannot use is the module's mistake
                raise _Refused(400, f"manifest refused: {exc}") from exc
        log.info("module announced", module=module, actions=len(manifest.actions), leases=len(manifest.leases))
        return {"announced": module}

    async def pull(self, request: Request) -> Any:
        module, body, request_id = await self._verified(request)
        wanted = self._parse(protocol.PullRequest, body)
        taken = await self._take_while_connected(request, module, wanted)
        if taken is None:
            return Response(status_code=499)  # nobody is listening: nothing was handed out
        calls = [
            protocol.PulledCall(
                id=c.id,
                kind=c.kind,
                path=protocol.CALL_PATHS[c.kind],
                idempotency_key=c.idempotency_key,
                body=c.body,
                delivery=c.deliveries,
                token=c.token,
            )
            for c in taken
        ]
        # A module that did not ask for delivery tokens may refuse a field it does not
        # know (the SDK's bodies forbid extras): it gets the calls as it always did.
        features = protocol.features(request.headers)
        exclude = None if protocol.FEATURE_TOKENS in features else {"calls": {"__all__": {"token"}}}
        answer = protocol.PullAnswer(calls=calls)
        secret = self.secrets[module]
        if protocol.FEATURE_SIGNED_BODY in features:
            raw = protocol.signed_body(
                secret, request_id, protocol.PULL, answer.model_dump(mode="json", exclude=exclude)
            )
            return Response(raw, media_type="application/json")
        raw = answer.model_dump_json(exclude=exclude).encode()
        headers = protocol.sign_answer(secret, request_id, protocol.PULL, raw)
        return Response(raw, media_type="application/json", headers=headers)

    async def _take_while_connected(
        self, request: Request, module: str, wanted: protocol.PullRequest
    ) -> list[QueuedCall] | None:
        """The calls for a poll, or None if its module hung up while the poll was held: a
        module process that died mid-poll would otherwise be handed calls nobody reads,
        each lost until its visibility timeout."""
        gone = asyncio.Event()

        async def watch() -> None:
            await _disconnected(request)
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            taken = await self.queue.take(module, wanted.max, wanted.wait, gone=gone)
        finally:
            watcher.cancel()
        if gone.is_set():
            if taken:  # handed out as the module hung up: due again at once
                await self.queue.calls.release([c.id for c in taken], self.queue.now())
            return None
        return taken

    async def answer(self, request: Request) -> Any:
        module, body, _ = await self._verified(request)
        posted = self._parse(protocol.AnswerPost, body)
        taken = await self.queue.answer(module, posted.id, posted.status, posted.body, posted.token)
        # Refused is still 200: the module did its part, and there is nothing to retry.
        return {"accepted": True} if taken else {"accepted": False, "reason": taken.reason}

    async def report(self, request: Request) -> Any:
        module, body, _ = await self._verified(request)
        report = self._parse(protocol.ReportRequest, body)
        step = await self.queue.calls.step_by_key(report.idempotency_key)
        if step is None or step.owner != module:
            raise _Refused(
                404, f"no step of module {module!r} has the key {report.idempotency_key!r}", "idempotency_key"
            )
        if step.reversible != Reversible.LEDGER.value:
            raise _Refused(422, f"step {step.name} ({step.action}) is not a 'ledger' action", "idempotency_key")
        run = await self.store.get_run(step.run_id)
        if run.cleanup_status not in (CleanupStatus.NOT_REQUIRED.value, CleanupStatus.PENDING.value):
            # Its cleanup has begun or ended: a row recorded now could be missed by it.
            raise _Refused(
                409, f"run {run.id}'s cleanup is {run.cleanup_status}; revert these yourself", "idempotency_key"
            )
        rows: list[NewResource] = []
        rejected: list[str] = []
        for entry in report.resources:
            row = normalise(entry, step.action, self.registry)
            if isinstance(row, str):
                rejected.append(row)
            else:
                rows.append(row)
        recorded = 0
        if rows:
            try:
                outcome = await self.store.record_late_resources(step, rows, self.queue.now())
            except InvalidState as exc:  # the cleanup began after the look above
                raise _Refused(409, exc.message, "idempotency_key") from exc
            rejected.extend(outcome.rejections)
            recorded = len(rows) - len(outcome.rejections)
        for reason in rejected:
            log.warning("late resource rejected", run_id=step.run_id, step=step.name, reason=reason)
        return protocol.ReportAnswer(recorded=recorded, rejected=rejected).model_dump(mode="json")

    def router(self) -> APIRouter:
        return gateway_router(lambda _request: self)

    def app(self) -> FastAPI:
        app = FastAPI(title="Roadie gateway", openapi_url=None, docs_url=None, redoc_url=None)
        app.include_router(self.router())

        @app.get("/healthz", include_in_schema=False)
        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

        return app


class Server(uvicorn.Server):
    """uvicorn serving a gateway: when it stops, the long polls it holds are answered at
    once (see `WorkQueue.close`) instead of each being waited out, up to its `wait`.

    A worker in the same process (`stop_worker`) is stopped first, while the gateway
    still serves: the calls it has queued for pulling modules are taken and answered
    here. Stopped the other way round, each of them waited out its whole deadline for an
    answer no module could bring (a cleanup round of four inspections held SIGTERM up
    for seven minutes). A second signal stops the server at once."""

    def __init__(
        self,
        config: uvicorn.Config,
        queue: Callable[[], WorkQueue | None],
        stop_worker: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(config)
        self._queue = queue
        self._stop_worker = stop_worker
        self._worker_stopping = False
        self._stopper: asyncio.Future[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._stop_worker is None or self._worker_stopping or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)
        self._worker_stopping = True
        asyncio.get_running_loop().call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        # Kept: a task nothing refers to but the loop may be collected before it ends.
        self._stopper = asyncio.ensure_future(self._stop_then_exit())

    async def _stop_then_exit(self) -> None:
        try:
            assert self._stop_worker is not None
            await self._stop_worker()
        finally:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        queue = self._queue()
        if queue is not None:
            queue.close()
        await super().shutdown(sockets=sockets)


async def _disconnected(request: Request) -> None:
    """Return when the client hangs up (its body was read: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def gateway_router(find: Callable[[Request], Gateway]) -> APIRouter:
    """The gateway's routes, each finding its `Gateway` from the request: an app that
    builds its gateway when it starts (`roadie serve`) mounts them before it has one."""
    router = APIRouter()
    for path, name in (
        (protocol.ANNOUNCE, "announce"),
        (protocol.PULL, "pull"),
        (protocol.ANSWER, "answer"),
        (protocol.REPORT, "report"),
    ):
        router.add_api_route(path, _guarded(find, name), methods=["POST"], include_in_schema=False)
    router.add_api_route(
        protocol.RETIRED_PREFIX + "/{rest:path}", _retired, methods=["GET", "POST"], include_in_schema=False
    )
    return router


async def _retired(rest: str) -> Response:
    """A module written for version 1 is told in one line what to change, not left to
    puzzle over a bare 401 or 404."""
    return _error(protocol.RETIRED, protocol.V1_RETIRED, None)


def _guarded(find: Callable[[Request], Gateway], name: str) -> Any:
    async def route(request: Request) -> Any:
        try:
            result = await getattr(find(request), name)(request)
        except _Refused as exc:
            return _error(exc.status, exc.message, exc.field, retryable=exc.retryable)
        return result if isinstance(result, Response) else JSONResponse(result)

    route.__name__ = f"gateway_{name}"
    return route

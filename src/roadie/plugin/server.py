"""A module server: one `Module`, written with the same decorators as an in-process one,
answering the remote protocol (docs/protocol.md, `roadie.protocol`).

`ModuleServer.handle` is the whole of it: one call's kind and body in, one `Reply`
(status, body, headers) out, with the key ledger between the engine and the module's
functions. The ASGI app (push) and the `PullClient` (pull) are two ways of feeding it, so
both transports answer the same bodies with the same statuses.

Statuses: 200 the answer; 400 a malformed body (a missing or out-of-range `fence`
included); 401 a refused signature; 404 an unknown action or lease; 412 a fence lower than
one the key ledger accepted for the call's key or lease target (or a `Superseded` the
module raised): nothing was done; 422 parameters that fail the action's schema, or a
PermanentError; 409 (retryable) the key is being dispatched by another live process; 503
(retryable) a RetryableError, with `Retry-After` when it says when; 500 (retryable)
anything else.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from roadie import protocol
from roadie.clock import Clock, SystemClock
from roadie.errors import ConfigError, PermanentError, RetryableError, RoadieError, StepError, Superseded
from roadie.log import get_logger
from roadie.plugin.ledger import KeyLedger
from roadie.plugin.wire import (
    AnswerDropped,
    Faults,
    Refusal,
    Reply,
    build_manifest,
    error_message,
    first_error,
    jsonable,
    lease_writer,
    parse_body,
    refused_reply,
    superseded_error,
    to_failure,
    to_inspected,
    to_resource,
    to_tagged_page,
    wire_answer,
    wire_resource,
)
from roadie.registry.module import (
    Call,
    InspectCall,
    Lease,
    LeaseCall,
    Module,
    ModuleConfig,
    RevertCall,
    TaggedCall,
    maybe_await,
)

__all__ = [
    "AnswerDropped",
    "Faults",
    "ModuleServer",
    "Reply",
    "View",
    "build_manifest",
    "serve_module",
    "wire_answer",
    "wire_resource",
]

log = get_logger(__name__)

View = Callable[[Any], Any]
"""A signed GET endpoint of the server's own: given the module's state, answers JSON."""


class ModuleServer:
    """Serves `module`: its state opened by its setup hook with `settings`, its key ledger
    in the SQLite file `ledger_path`, every request checked against `secret`.

    Open it with `await server.open()` (or `async with server:`; the ASGI app's lifespan
    does it, and the first request does it if nothing did). `engine_url` is where
    `report` sends late resources. `views` adds signed GET endpoints of the server's own.
    """

    def __init__(
        self,
        module: Module,
        *,
        secret: protocol.Secrets,
        ledger_path: str,
        settings: Mapping[str, Any] | None = None,
        base_dir: str = ".",
        clock: Clock | None = None,
        faults: Faults | None = None,
        engine_url: str | None = None,
        views: Mapping[str, View] | None = None,
        max_skew: float = protocol.MAX_SKEW,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        if not secret:
            raise ConfigError(f"module server {module.name!r} needs a shared secret")
        module.check()
        self.module = module
        self._secret = secret
        self.ledger_path = ledger_path
        self.settings = dict(settings or {})
        self.base_dir = base_dir
        self.clock: Clock = clock or SystemClock()
        self.faults = faults or Faults()
        self.engine_url = engine_url.rstrip("/") if engine_url else None
        self.views = dict(views or {})
        self.max_skew = max_skew
        self._manifest = build_manifest(module)
        self._http = http
        self._own_http = http is None
        self._rng = random.Random(self.faults.seed)
        self._failed_first = 0
        self._open_lock: asyncio.Lock | None = None
        self._key_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._ledger: KeyLedger | None = None
        self.state: Any = None

    def __repr__(self) -> str:  # never the secret
        return f"<ModuleServer {self.module.name} ledger={self.ledger_path!r}>"

    # -- lifecycle -------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._ledger is not None

    @property
    def ledger(self) -> KeyLedger:
        if self._ledger is None:
            raise RoadieError(f"module server {self.module.name!r} is not open")
        return self._ledger

    async def open(self) -> None:
        """Open the key ledger and run the module's setup hook; opening twice is once."""
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._ledger is not None:
                return
            ledger = KeyLedger(self.ledger_path, self.clock)
            try:
                if self.module.setup_fn is not None:
                    config = ModuleConfig(settings=self.settings, clock=self.clock, base_dir=self.base_dir)
                    self.state = await maybe_await(self.module.setup_fn(config))
            except BaseException:
                ledger.close()
                raise
            self._ledger = ledger
            log.info("module server open", module=self.module.name, ledger=self.ledger_path)

    async def close(self) -> None:
        """Close the module's state, the key ledger and the HTTP client; closing twice is once."""
        ledger, self._ledger = self._ledger, None
        if ledger is None:
            return
        try:
            if self.module.close_fn is not None:
                await maybe_await(self.module.close_fn(self.state))
        finally:
            self.state = None
            ledger.close()
            if self._own_http and self._http is not None:
                await self._http.aclose()
                self._http = None

    async def __aenter__(self) -> ModuleServer:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the protocol ------------------------------------------------------------------

    def manifest(self) -> protocol.Manifest:
        return self._manifest

    def sign_answer(self, request_id: str, path: str, content: bytes) -> dict[str, str]:
        """The headers that sign an answer to request `request_id` for `path`."""
        return protocol.sign_answer(self._secret, request_id, path, content, clock=self.clock)

    async def handle_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        """One HTTP request: its signature checked, then routed by method and path."""
        try:
            signed = protocol.verify(
                self._secret, method, path, headers, body, max_skew=self.max_skew, clock=self.clock
            )
            await self.open()
            if not self.ledger.first_sight(signed.id, signed.sent + self.max_skew):
                raise protocol.SignatureRefused(protocol.REPLAYED)
        except protocol.SignatureRefused as exc:
            log.info("request refused", module=self.module.name, path=path, reason=exc.message)
            return Reply(401, protocol.error_body(exc.message))
        if method == "GET" and path == protocol.MANIFEST:
            return Reply(200, self._manifest.model_dump(mode="json"))
        if method == "GET" and path in self.views:
            return await self._view(self.views[path])
        for kind, call_path in protocol.CALL_PATHS.items():
            if path == call_path:
                if method != "POST":
                    return Reply(405, protocol.error_body(f"{path} takes POST, not {method}"))
                return await self.handle(kind, body)  # type: ignore[arg-type]
        return Reply(404, protocol.error_body(f"no such path {path!r}"))

    async def handle(self, kind: protocol.CallKind, body: bytes) -> Reply:
        """One call of the protocol, already authenticated: its reply, whatever happens."""
        try:
            await self.open()
            if self.faults.delay:
                await self.clock.sleep(self.faults.delay)
            handler = self._handlers[kind]
            reply: Reply = await handler(self, body)
            return reply
        except Refusal as exc:
            return refused_reply(exc)
        except Superseded as exc:
            # The module's own fence check (one that keeps its marks with its world) refused
            # the call: the same answer as the key ledger's, with the mark where it said it.
            log.info("call superseded", module=self.module.name, kind=kind, reason=exc.message)
            message = exc.message or type(exc).__doc__ or "superseded"
            return Reply(protocol.SUPERSEDED, superseded_error(message, exc.mark))
        except StepError as exc:
            message = exc.message or type(exc).__name__
            if not exc.retryable:
                return Reply(422, protocol.error_body(message, field=getattr(exc, "field", None)))
            headers = {}
            if exc.next_retry_delay is not None:
                headers["Retry-After"] = str(max(0, math.ceil(exc.next_retry_delay)))
            return Reply(503, protocol.error_body(message, retryable=True), headers)
        except RoadieError as exc:
            return Reply(422, protocol.error_body(exc.message or type(exc).__name__))
        except Exception as exc:
            # It may have acted before it raised: the engine retries under the same key, and
            # the module's tags (or this ledger, once an answer is stored) keep that exact.
            log.warning("call failed", module=self.module.name, kind=kind, exc_info=True)
            return Reply(500, protocol.error_body(f"{type(exc).__name__}: {exc}", retryable=True))

    async def _view(self, view: View) -> Reply:
        try:
            await self.open()
            return Reply(200, jsonable(await maybe_await(view(self.state))))
        except Exception as exc:
            log.warning("view failed", module=self.module.name, exc_info=True)
            return Reply(500, protocol.error_body(f"{type(exc).__name__}: {exc}", retryable=True))

    async def _dispatch(self, body: bytes) -> Reply:
        request = parse_body(protocol.DispatchRequest, body)
        action = self.module.actions.get(request.action)
        if action is None:
            raise Refusal(404, f"module {self.module.name!r} has no action {request.action!r}", "action")
        try:
            params = action.params.model_validate(request.params)
        except ValidationError as exc:
            message, where = first_error(exc)
            raise Refusal(422, f"{action.id}: {message}", f"params.{where}" if where else "params") from None
        if self._failed_first < self.faults.fail_first:
            self._failed_first += 1
            raise RetryableError(f"injected failure {self._failed_first} of {self.faults.fail_first} (fail_first)")
        key = request.idempotency_key
        with self._held(key) as lock:
            async with lock:
                begun = self.ledger.begin(key, action.name, request.fence)
                if begun.superseded is not None:
                    raise _superseded(self, "dispatch", key, request.fence, begun.superseded)
                if begun.refused is not None:
                    raise Refusal(422, begun.refused, "idempotency_key")
                if begun.busy is not None:
                    raise Refusal(409, f"key {key!r} is being dispatched by another process", retryable=True)
                if begun.stored:
                    log.info("answer replayed", module=self.module.name, action=action.name, key=key)
                    answer = begun.answer
                else:
                    call = Call(
                        run_id=request.run_id,
                        step_id=request.step_id,
                        idempotency_key=key,
                        attempt=request.attempt,
                        params=params,
                        state=self.state,
                        clock=self.clock,
                        fence=request.fence,
                    )
                    try:
                        answer = wire_answer(await action.call(call))
                    except BaseException as exc:
                        self.ledger.fail(key, f"{type(exc).__name__}: {exc}")
                        raise
                    self.ledger.finish(key, answer)
        lost = self.faults.lose_answers > 0 and self._rng.random() < self.faults.lose_answers
        if lost:
            log.info("answer dropped on purpose", module=self.module.name, action=action.name, key=key)
        return Reply(200, answer, lost=lost)

    async def _revert(self, body: bytes) -> Reply:
        request = parse_body(protocol.RevertRequest, body)
        action = self.module.actions.get(request.action)
        if action is None:
            raise Refusal(404, f"module {self.module.name!r} has no action {request.action!r}", "action")
        if action.revert_fn is None:
            raise Refusal(422, f"{action.id} is not a 'ledger' action: it has no revert", "action")
        key = request.idempotency_key
        with self._held(key) as lock:
            async with lock:
                begun = self.ledger.begin_revert(key, action.name, request.fence)
                if begun.superseded is not None:
                    raise _superseded(self, "revert", key, request.fence, begun.superseded)
                if begun.busy is not None:
                    raise Refusal(409, f"key {key!r} is being dispatched by another process", retryable=True)
                given = [to_resource(r.model_dump(by_alias=True)) for r in request.resources]
                # No resources given: whatever this key produced, as its stored answer says;
                # none stored (the action crashed midway), so the module finds it by its tags.
                resources = given or [to_resource(r) for r in begun.answer if isinstance(r, dict)]
                call = RevertCall(
                    run_id=request.run_id,
                    idempotency_key=key,
                    resources=resources,
                    state=self.state,
                    clock=self.clock,
                    fence=request.fence,
                )
                result = await maybe_await(action.revert_fn(call))
                self.ledger.finish_revert(key)
        failures = [to_failure(f) for f in result or []]
        log.info("reverted", module=self.module.name, action=action.name, key=key, failures=len(failures))
        return Reply(200, protocol.RevertAnswer(failures=failures).model_dump(mode="json"))

    async def _inspect(self, body: bytes) -> Reply:
        request = parse_body(protocol.InspectRequest, body)
        if self.module.inspect_fn is None:
            raise Refusal(404, f"module {self.module.name!r} does not answer inspect")
        resources = [to_resource(r.model_dump(by_alias=True)) for r in request.resources]
        call = InspectCall(
            run_id=request.run_id,
            idempotency_key=request.idempotency_key,
            resources=resources,
            state=self.state,
            clock=self.clock,
            action=request.action or None,
        )
        found = list(await maybe_await(self.module.inspect_fn(call)) or [])
        if len(found) != len(resources):
            raise RoadieError(f"inspect answered {len(found)} entries for {len(resources)} resources")
        answer = protocol.InspectAnswer(
            resources=[to_inspected(entry, resource) for entry, resource in zip(found, resources, strict=True)]
        )
        return Reply(200, answer.model_dump(mode="json"))

    async def _tagged(self, body: bytes) -> Reply:
        request = parse_body(protocol.TaggedRequest, body)
        if self.module.tagged_fn is None:
            raise Refusal(404, f"module {self.module.name!r} does not answer tagged")
        call = TaggedCall(after=request.after, limit=request.limit, state=self.state, clock=self.clock)
        page = to_tagged_page(await maybe_await(self.module.tagged_fn(call)))
        return Reply(200, page.model_dump(mode="json"))

    def _lease_call(self, body: bytes, *, writes: bool = False) -> tuple[protocol.LeaseRequest, Lease, LeaseCall]:
        """A lease call's request, its lease and the call for the module's function. A
        write (apply, restore) must carry a fence; a read carries none."""
        request = parse_body(protocol.LeaseRequest, body)
        if writes and request.fence is None:
            raise Refusal(400, "malformed request: fence: Field required (a lease write carries its fence)", "fence")
        lease = self.module.leases.get(request.lease)
        if lease is None:
            raise Refusal(404, f"module {self.module.name!r} has no lease {request.lease!r}", "lease")
        if lease.targeted and not request.target:
            raise Refusal(422, f"{lease.id} is targeted: name its target", "target")
        if not lease.targeted and request.target is not None:
            raise Refusal(422, f"{lease.id} is not targeted: it takes no target", "target")
        call = LeaseCall(
            lease=lease.name,
            target=request.target,
            state=self.state,
            clock=self.clock,
            idempotency_key=request.idempotency_key,
            run_id=request.run_id,
            fence=request.fence or 0,
        )
        return request, lease, call

    async def _lease_read(self, body: bytes) -> Reply:
        request, lease, call = self._lease_call(body)
        self.ledger.seen_lease(request.idempotency_key, lease.name, request.target, request.run_id)
        value = await maybe_await(lease.read_fn(call))
        return Reply(200, protocol.LeaseValue(value=jsonable(value)).model_dump(mode="json"))

    async def _lease_apply(self, body: bytes) -> Reply:
        """Write a borrowed value, once per key, and never after its borrow was given back."""
        request, lease, call = self._lease_call(body, writes=True)
        key = request.idempotency_key
        fence = request.fence or 0
        # One lease target's writes, one at a time: an apply and the restore that gives it
        # back must not interleave between the ledger's verdict and the world's write.
        with self._held(_target_lock(lease, request.target)) as lock:
            async with lock:
                begun = self.ledger.begin_apply(key, lease.name, request.target, request.run_id, fence)
                if begun.superseded is not None:
                    raise _superseded(self, "lease apply", request.fence_target, fence, begun.superseded)
                if begun.refused is not None:
                    log.info("late lease apply refused", module=self.module.name, lease=lease.name, key=key)
                    raise Refusal(422, begun.refused, "idempotency_key")
                if begun.stored:
                    log.info("lease apply replayed", module=self.module.name, lease=lease.name, key=key)
                    return Reply(200, begun.answer)
                await maybe_await(lease_writer(lease)(call, request.value))
                self.ledger.finish_apply(key, {})
        return Reply(200, {})

    async def _lease_restore(self, body: bytes) -> Reply:
        """Give a borrowed value back; from now on the borrow's late applies are refused."""
        request, lease, call = self._lease_call(body, writes=True)
        key = request.idempotency_key
        fence = request.fence or 0
        with self._held(_target_lock(lease, request.target)) as lock:
            async with lock:
                begun = self.ledger.begin_restore(key, lease.name, request.target, request.run_id, fence)
                if begun.superseded is not None:
                    raise _superseded(self, "lease restore", request.fence_target, fence, begun.superseded)
                if begun.stored:
                    log.info("lease restore replayed", module=self.module.name, lease=lease.name, key=key)
                    return Reply(200, begun.answer)
                await maybe_await((lease.restore_fn or lease_writer(lease))(call, request.value))
                self.ledger.finish_restore(key, {})
        return Reply(200, {})

    _handlers: dict[str, Callable[[ModuleServer, bytes], Any]] = {
        "dispatch": _dispatch,
        "revert": _revert,
        "inspect": _inspect,
        "tagged": _tagged,
        "lease.read": _lease_read,
        "lease.apply": _lease_apply,
        "lease.restore": _lease_restore,
    }

    @contextmanager
    def _held(self, key: str) -> Iterator[asyncio.Lock]:
        """The key's in-process lock, forgotten once nobody waits on it: concurrent
        duplicates of one key queue behind the first and then find its stored answer."""
        lock, users = self._key_locks.get(key) or (asyncio.Lock(), 0)
        self._key_locks[key] = (lock, users + 1)
        try:
            yield lock
        finally:
            lock, users = self._key_locks[key]
            if users <= 1:
                del self._key_locks[key]
            else:
                self._key_locks[key] = (lock, users - 1)

    # -- late reports ------------------------------------------------------------------

    async def report(
        self, idempotency_key: str, resources: Sequence[Any], *, engine_url: str | None = None
    ) -> protocol.ReportAnswer:
        """Report resources an effect made by itself afterwards, against its step's key.

        They are kept in the key ledger first (so a revert by key alone covers them even if
        the engine never hears of them), then POSTed, signed, to the engine's gateway.
        Raises RetryableError when the engine could not be reached or may take them later,
        PermanentError when it refused them.
        """
        url = (engine_url or self.engine_url or "").rstrip("/")
        if not url:
            raise ConfigError(f"module server {self.module.name!r} has no engine_url to report to")
        await self.open()
        wire = [wire_resource(r) for r in resources]
        self.ledger.add_late(idempotency_key, wire)
        body = protocol.ReportRequest(idempotency_key=idempotency_key, resources=wire).model_dump(mode="json")
        status, answer = await self.post(url, protocol.REPORT, body, key=idempotency_key)
        if 200 <= status < 300:
            return protocol.ReportAnswer.model_validate(answer)
        message = f"{self.module.name} report: HTTP {status}: {error_message(answer)}"
        if protocol.retryable_status(status):
            raise RetryableError(message)
        raise PermanentError(message)

    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        return self._http

    async def post(
        self,
        base_url: str,
        path: str,
        body: Any,
        *,
        key: str = protocol.NO_KEY,
        read_timeout: float | None = None,
        signed_answer: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        """POST `body` to the engine, signed as this module; its status and parsed body.
        A transport failure raises RetryableError. With `signed_answer`, a 2xx answer the
        engine did not sign with this module's secret for this very request is refused
        (RetryableError)."""
        raw = json.dumps(body, separators=(",", ":")).encode()
        headers = protocol.sign(self._secret, "POST", path, raw, key=key, module=self.module.name, clock=self.clock)
        headers.update(extra_headers or {})
        try:
            response = await self.http().post(
                base_url + path,
                content=raw,
                headers=headers,
                timeout=httpx.USE_CLIENT_DEFAULT if read_timeout is None else read_timeout,
            )
        except httpx.TransportError as exc:
            raise RetryableError(f"{self.module.name}: {base_url}{path}: {type(exc).__name__}: {exc}") from exc
        if signed_answer and response.is_success:
            try:
                protocol.verify_answer(
                    self._secret,
                    headers[protocol.H_ID],
                    path,
                    response.headers,
                    response.content,
                    max_skew=self.max_skew,
                    clock=self.clock,
                )
            except protocol.SignatureRefused as exc:
                raise RetryableError(f"{self.module.name}: {base_url}{path} answered unsigned: {exc.message}") from exc
        try:
            parsed = response.json() if response.content else None
        except ValueError:
            parsed = response.text[:200]
        return response.status_code, parsed

    # -- ASGI ----------------------------------------------------------------------------

    def app(self) -> Starlette:
        """The push server: an ASGI app whose lifespan opens and closes this server."""

        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            await self.open()
            try:
                yield
            finally:
                await self.close()

        endpoint = _Endpoint(self)
        routes = [Route(protocol.MANIFEST, endpoint, methods=["GET"])]
        routes += [Route(path, endpoint, methods=["POST"]) for path in protocol.CALL_PATHS.values()]
        routes += [Route(path, endpoint, methods=["GET"]) for path in self.views]
        app = Starlette(routes=routes, lifespan=lifespan)
        app.state.roadie = self
        return app


def _superseded(server: ModuleServer, what: str, target: str, fence: int, mark: int) -> Refusal:
    """The refusal of a call whose fence is lower than its target's mark (docs/protocol.md
    §4, rule 7): its owner's claim has lapsed, and a newer owner has acted."""
    log.info("call superseded", module=server.module.name, call=what, target=target, fence=fence, mark=mark)
    return Refusal(protocol.SUPERSEDED, "", body=protocol.superseded_body(target, fence, mark))


def _target_lock(lease: Lease, target: str | None) -> str:
    """The in-process lock name of one lease target (NUL cannot start a key on the wire)."""
    return f"\x00lease\x00{lease.name}#{target or ''}"


class _Endpoint:
    """Every route's ASGI endpoint. Raw ASGI rather than a Response, because a dropped
    answer must break the connection mid-response, not end it with a clean status."""

    def __init__(self, server: ModuleServer) -> None:
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        body = await protocol.read_capped(request.stream(), request.headers.get("content-length"))
        if body is None:
            reply = Reply(413, protocol.error_body(f"request body over the limit of {protocol.MAX_BODY_BYTES} bytes"))
        else:
            reply = await self.server.handle_request(request.method, request.url.path, request.headers, body)
        content = json.dumps(reply.body, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
        headers += [(name.lower().encode(), value.encode()) for name, value in reply.headers.items()]
        request_id = request.headers.get(protocol.H_ID, "")
        if protocol.is_request_id(request_id):
            # Signed under the request's id, so it passes for the answer to no other.
            signed = self.server.sign_answer(request_id, request.url.path, content)
            headers += [(name.lower().encode(), value.encode()) for name, value in signed.items()]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        if reply.lost:
            # Headers promised a body that never comes: the server closes the connection
            # and the client sees a broken response, exactly like a crash after acting.
            raise AnswerDropped()
        await send({"type": "http.response.body", "body": content})


def serve_module(
    module: Module,
    *,
    secret: protocol.Secrets,
    ledger_path: str,
    settings: Mapping[str, Any] | None = None,
    base_dir: str = ".",
    clock: Clock | None = None,
    faults: Faults | None = None,
    engine_url: str | None = None,
    views: Mapping[str, View] | None = None,
) -> Starlette:
    """An ASGI app serving `module` over the remote protocol. Its `ModuleServer` is
    `app.state.roadie` (for `report`, or to open and close it without a lifespan)."""
    server = ModuleServer(
        module,
        secret=secret,
        ledger_path=ledger_path,
        settings=settings,
        base_dir=base_dir,
        clock=clock,
        faults=faults,
        engine_url=engine_url,
        views=views,
    )
    return server.app()

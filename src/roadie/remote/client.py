"""The engine's side of a remote module: a `Module` built from the server's manifest whose
actions, reverts, leases and inspect are calls over one of two transports.

*Push* (`PushTransport`) POSTs each body to the module's server. *Pull* (`PullTransport`)
puts the same body on the work queue, where the module fetches it, and waits for the
answer it posts back. Either way one call answers `(status, body)` and is judged here:
2xx is the answer; 5xx, 408/409/425/429 and transport failures may pass on a retry under
the same key; any other 4xx is permanent, with the server's own message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx2
from pydantic import ValidationError

from roadie.clock import Clock, SystemClock
from roadie.errors import (
    AnswerLost,
    ConfigError,
    PermanentError,
    RegistryError,
    RetryableError,
    StepError,
    StepTimeout,
    Superseded,
)
from roadie.log import get_logger
from roadie.registry.module import (
    Call,
    InspectCall,
    Inspected,
    LeaseCall,
    Module,
    RevertCall,
    RevertFailure,
    Tagged,
    TaggedCall,
    TaggedPage,
)
from roadie.remote import protocol
from roadie.remote.schema import check_value_schema, params_model
from roadie.states import Reversible

log = get_logger(__name__)

# How often cleanup-side calls (revert, inspect, lease) are tried before the failure is
# cleanup's to report: they are idempotent by key, and a module server restarting should
# not make a whole cleanup `incomplete`.
SIDE_CALL_ATTEMPTS = 4
SIDE_CALL_BACKOFF = 0.25

# How long one call may wait on a module, on the injectable clock, before its caller gets
# a retryable StepTimeout (and a queued call is withdrawn): nothing waits on a module for
# ever (DESIGN §11).
CALL_TIMEOUT = 60.0


class Transport(Protocol):
    name: str
    mode: str  # "push" or "pull"

    async def call(self, kind: protocol.CallKind, body: dict[str, Any], key: str) -> tuple[int, Any]:
        """Send one call; answer its status and parsed body. Transport failures raise."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RemoteSettings:
    """A remote module's table in `roadie.toml`.

    ```toml
    [modules.world]
    url = "http://10.0.0.5:7300"       # push: the module's server
    secret_env = "ROADIE_SECRET_WORLD"  # or `secret = "..."` (a list while rotating);
                                        # the default is ROADIE_SECRET_<NAME>
    connect_timeout = 2.0
    read_timeout = 30.0
    call_timeout = 60.0                 # the most one call waits on the module, in all

    [modules.luamod]
    transport = "pull"                  # the module polls the engine's gateway
    ```
    """

    name: str
    transport: str
    url: str | None
    secret: protocol.Secrets
    connect_timeout: float = 2.0
    read_timeout: float = 30.0
    max_connections: int = 100
    call_timeout: float = CALL_TIMEOUT

    @classmethod
    def from_table(cls, name: str, table: Mapping[str, Any]) -> RemoteSettings:
        transport = str(table.get("transport", "push" if "url" in table else "pull"))
        if transport not in ("push", "pull"):
            raise ConfigError(f"[modules.{name}] transport must be 'push' or 'pull', not {transport!r}")
        url = table.get("url")
        if transport == "push" and not url:
            raise ConfigError(f"[modules.{name}] a push module needs its server's url")
        return cls(
            name=name,
            transport=transport,
            url=str(url).rstrip("/") if url else None,
            secret=module_secret(name, table),
            connect_timeout=float(table.get("connect_timeout", 2.0)),
            read_timeout=float(table.get("read_timeout", 30.0)),
            max_connections=int(table.get("max_connections", 100)),
            call_timeout=float(table.get("call_timeout", CALL_TIMEOUT)),
        )


def is_remote(table: Mapping[str, Any]) -> bool:
    return "url" in table or "transport" in table


def module_secret(name: str, table: Mapping[str, Any]) -> protocol.Secrets:
    """The module's shared secret: `secret` (a string, or a list of several), or the
    environment variable `secret_env` names, or `ROADIE_SECRET_<NAME>`; several secrets
    in one string are `whsec_` secrets separated by spaces. Never logged."""
    given = table.get("secret")
    if isinstance(given, list):  # several, while one is rotated out (docs/protocol.md §1)
        return _checked_secret(name, [str(s) for s in given])
    if given:
        return _checked_secret(name, str(given))
    variable = str(table.get("secret_env") or f"ROADIE_SECRET_{name.upper()}")
    secret = os.environ.get(variable)
    if not secret or not secret.strip():
        raise ConfigError(f"module {name!r} needs a shared secret: set {variable} (or secret_env / secret)")
    return _checked_secret(name, secret)


def _checked_secret(name: str, secret: protocol.Secrets) -> protocol.Secrets:
    try:
        for one in protocol.secret_list(secret):
            protocol.secret_bytes(one)
    except ValueError as exc:
        raise ConfigError(f"module {name!r}: its secret is not usable: {exc}") from None
    return secret


def _message(body: Any, status: int) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"]
        where = f" ({detail['field']})" if detail.get("field") else ""
        return f"{detail.get('message', '')}{where}"
    return f"HTTP {status}: {str(body)[:200]}"


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    raw = (headers or {}).get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


class PushTransport:
    """Calls a module's server over HTTP, with pooled connections. Each request is signed
    on `clock` and given up after `settings.call_timeout` of it.

    The client is httpx2's (the maintained fork of httpx, the same interface): httpx's pool
    goes over every connection it holds, twice over for each idle one, on every request and
    every answer, so that at 25 calls at once it spent twice httpx2's CPU on each call.
    httpx2 before 2.17 still probed each idle connection's socket on every pass (building
    anyio's table of socket attributes each time); 2.17 probes one when it is taken."""

    def __init__(
        self, settings: RemoteSettings, *, client: httpx2.AsyncClient | None = None, clock: Clock | None = None
    ) -> None:
        assert settings.url is not None
        self.name = settings.name
        self.mode = "push"
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.client = client or httpx2.AsyncClient(
            base_url=settings.url,
            timeout=httpx2.Timeout(settings.read_timeout, connect=settings.connect_timeout),
            limits=httpx2.Limits(max_connections=settings.max_connections, max_keepalive_connections=32),
        )

    async def call(self, kind: protocol.CallKind, body: dict[str, Any], key: str) -> tuple[int, Any]:
        return await self.request("POST", protocol.CALL_PATHS[kind], body, key)

    async def request(self, method: str, path: str, body: dict[str, Any] | None, key: str) -> tuple[int, Any]:
        raw = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = protocol.sign(self.settings.secret, method, path, raw, key=key, clock=self.clock)
        deadline = self.settings.call_timeout
        try:
            # The client's own timeouts bound each phase; this bounds the whole, on the clock
            # every other wait reads, so a server that trickles bytes cannot hold a worker.
            async with (
                self.clock.timeout(deadline),
                self.client.stream(method, path, content=raw, headers=headers) as response,
            ):
                answer = await protocol.read_capped(response.aiter_bytes(), response.headers.get("content-length"))
        except TimeoutError as exc:
            raise StepTimeout(f"{self.name}: no answer from {self.settings.url} within {deadline:g}s") from exc
        except httpx2.ConnectError as exc:
            raise RetryableError(f"{self.name}: cannot connect to {self.settings.url}: {exc}") from exc
        except httpx2.TimeoutException as exc:
            raise AnswerLost(f"{self.name}: no answer from {self.settings.url} in time ({type(exc).__name__})") from exc
        except httpx2.TransportError as exc:
            # The connection broke after the request went out: the module may have acted.
            raise AnswerLost(f"{self.name}: the answer was lost ({type(exc).__name__}: {exc})") from exc
        if answer is None:
            raise AnswerLost(f"{self.name}: its answer is over {protocol.MAX_BODY_BYTES} bytes; not read")
        self._check_signed(headers[protocol.H_ID], path, response, answer)
        try:
            parsed: Any = json.loads(answer) if answer else None
        except ValueError:
            parsed = _NotJSON(answer[:200].decode(errors="replace"))
        return response.status_code, _WithHeaders.wrap(parsed, response.headers)

    def _check_signed(self, request_id: str, path: str, response: httpx2.Response, answer: bytes) -> None:
        """Believe nothing an answer says unless the module signed it for this request:
        anyone on the way could have written it, or replayed another request's."""
        try:
            protocol.verify_answer(self.settings.secret, request_id, path, response.headers, answer, clock=self.clock)
        except protocol.SignatureRefused as exc:
            if response.status_code == 401:
                # The module refused our request; its refusal cannot be checked either when
                # the two sides hold different secrets.
                raise PermanentError(
                    f"{self.name}: the module refused our signature (HTTP 401, unverified answer: {exc.message}); "
                    "check that the engine and the module hold the same secret"
                ) from exc
            raise AnswerLost(f"{self.name}: {exc.message}; asking again") from exc

    async def close(self) -> None:
        await self.client.aclose()


class _NotJSON(str):
    """A body that did not parse as JSON: not an answer."""


class _WithHeaders:
    """A parsed body, with the response headers the judgement needs (Retry-After)."""

    def __init__(self, body: Any, headers: Mapping[str, str]) -> None:
        self.body = body
        self.headers = headers

    @classmethod
    def wrap(cls, body: Any, headers: Mapping[str, str]) -> Any:
        return cls(body, headers) if "retry-after" in headers else body


def judge(name: str, kind: str, status: int, body: Any) -> Any:
    """The answer of a 2xx; otherwise the error a step or cleanup should see."""
    headers: Mapping[str, str] | None = None
    if isinstance(body, _WithHeaders):
        body, headers = body.body, body.headers
    if 200 <= status < 300:
        resources = body.get("resources") if isinstance(body, dict) else None
        if kind == "dispatch" and isinstance(resources, list) and len(resources) > protocol.MAX_RESOURCES:
            # Nothing of it is recorded: the step fails, and its cleanup reverts by key.
            raise PermanentError(
                f"{name} {kind}: the answer lists {len(resources)} resources, over the limit of "
                f"{protocol.MAX_RESOURCES}"
            )
        return body
    message = f"{name} {kind}: {_message(body, status)}"
    if protocol.is_superseded(status, body):
        raise Superseded(message)
    if protocol.retryable_status(status):
        raise RetryableError(message, next_retry_delay=_retry_after(headers))
    raise PermanentError(message)


class RemoteModule:
    """Builds the `Module` a manifest describes, every function a call over `transport`."""

    def __init__(self, manifest: protocol.Manifest, transport: Transport, *, clock: Clock | None = None) -> None:
        self.manifest = manifest
        self.transport = transport
        self.clock: Clock = clock or SystemClock()

    def build(self) -> Module:
        manifest = self.manifest
        module = Module(manifest.module, manifest.description or f"remote module ({self.transport.mode})")
        for spec in manifest.actions:
            self._add_action(module, spec)
        for lease_spec in manifest.leases:
            self._add_lease(module, lease_spec)
        if manifest.inspect:
            module.inspect(self._inspect)
        if manifest.tagged:
            module.tagged(self._tagged)
        transport = self.transport

        async def close(_state: Any) -> None:
            await transport.close()

        module.close(close)
        return module

    async def _call(self, kind: protocol.CallKind, body: dict[str, Any], key: str) -> Any:
        status, answer = await self.transport.call(kind, body, key)
        return judge(self.manifest.module, kind, status, answer)

    async def _side_call(self, kind: protocol.CallKind, body: dict[str, Any], key: str) -> Any:
        """A cleanup-side call, tried a few times across a server's restart."""
        for attempt in range(1, SIDE_CALL_ATTEMPTS + 1):
            try:
                return await self._call(kind, body, key)
            except StepError as exc:
                if not exc.retryable or attempt == SIDE_CALL_ATTEMPTS:
                    raise
                await self.clock.sleep(exc.next_retry_delay or SIDE_CALL_BACKOFF * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _add_action(self, module: Module, spec: protocol.ActionSpec) -> None:
        action_id = f"{module.name}.{spec.name}"
        try:
            model = params_model(action_id, spec.params)
        except RegistryError as exc:
            raise RegistryError(f"{action_id}: {exc.message}") from exc
        name = spec.name

        async def dispatch(call: Call[Any]) -> Any:
            body = protocol.DispatchRequest(
                action=name,
                run_id=call.run_id,
                step_id=call.step_id,
                idempotency_key=call.idempotency_key,
                attempt=max(1, call.attempt),
                params=call.params.model_dump(mode="json", by_alias=True),
                fence=max(1, call.fence),
            ).model_dump(mode="json")
            # A body that is not JSON comes back as a string, which the ledger refuses as
            # "not an answer": the placeholder stays, and cleanup reverts by key.
            return await self._call("dispatch", body, call.idempotency_key)

        action = module.action(
            spec.name, reversible=Reversible(spec.reversible), params=model, description=spec.description
        )(dispatch)
        if action.reversible is Reversible.LEDGER:

            async def revert(call: RevertCall) -> list[RevertFailure]:
                body = protocol.RevertRequest(
                    action=name,
                    run_id=call.run_id,
                    idempotency_key=call.idempotency_key,
                    resources=[_wire(r.kind, r.ref, r.payload, r.member_key) for r in call.resources],
                    fence=max(1, call.fence),
                ).model_dump(mode="json", by_alias=True)
                answer = await self._side_call("revert", body, call.idempotency_key)
                try:
                    parsed = protocol.RevertAnswer.model_validate(answer or {})
                except ValidationError as exc:
                    raise PermanentError(f"{action_id} revert answered something unreadable: {exc}") from exc
                return [RevertFailure(f.kind, f.ref, f.message) for f in parsed.failures]

            action.revert(revert)

    def _add_lease(self, module: Module, spec: protocol.LeaseSpec) -> None:
        name = spec.name
        lease_id = f"{module.name}.{name}"

        def body(call: LeaseCall, value: Any = None, *, writes: bool = True) -> dict[str, Any]:
            return protocol.LeaseRequest(
                lease=name,
                target=call.target,
                run_id=call.run_id or 0,
                idempotency_key=call.idempotency_key or f"lease-{lease_id}",
                value=value,
                fence=max(1, call.fence) if writes else None,
            ).model_dump(mode="json", exclude=None if writes else {"fence"})

        async def read(call: LeaseCall) -> Any:
            answer = await self._side_call(
                "lease.read", body(call, writes=False), call.idempotency_key or protocol.NO_KEY
            )
            return _lease_value(lease_id, answer)

        async def apply(call: LeaseCall, value: Any) -> None:
            await self._side_call("lease.apply", body(call, value), call.idempotency_key or protocol.NO_KEY)

        async def restore(call: LeaseCall, value: Any) -> None:
            await self._side_call("lease.restore", body(call, value), call.idempotency_key or protocol.NO_KEY)

        if spec.value is not None:
            check_value_schema(lease_id, spec.value)
        lease = module.lease(
            name, targeted=spec.targeted, stacks=spec.stacks, description=spec.description, value=spec.value
        )(read)
        lease.write(apply)
        lease.restore(restore)

    async def _inspect(self, call: InspectCall) -> list[Inspected]:
        if not call.resources:
            return []
        # The action named is the one that made the resources; a module that answers inspect
        # answers it for all of its actions, so any of them will do when none is known.
        body = protocol.InspectRequest(
            action=call.action or "",
            run_id=call.run_id,
            idempotency_key=call.idempotency_key,
            resources=[_wire(r.kind, r.ref, r.payload, r.member_key) for r in call.resources],
        ).model_dump(mode="json", by_alias=True)
        answer = await self._side_call("inspect", body, call.idempotency_key)
        try:
            parsed = protocol.InspectAnswer.model_validate(answer)
        except ValidationError as exc:
            raise PermanentError(f"{self.manifest.module} inspect answered something unreadable: {exc}") from exc
        return [Inspected(i.kind, i.ref, i.exists, i.ours) for i in parsed.resources]

    async def _tagged(self, call: TaggedCall) -> TaggedPage:
        body = protocol.TaggedRequest(after=call.after, limit=call.limit).model_dump(mode="json")
        answer = await self._side_call("tagged", body, protocol.NO_KEY)
        try:
            parsed = protocol.TaggedAnswer.model_validate(answer)
        except ValidationError as exc:
            raise PermanentError(f"{self.manifest.module} tagged answered something unreadable: {exc}") from exc
        objects = [Tagged(o.kind, o.ref, o.key, o.payload) for o in parsed.objects]
        return TaggedPage(objects, parsed.next)


def _wire(kind: str, ref: str, payload: Any, member_key: str | None) -> protocol.WireResource:
    return protocol.WireResource(kind=kind, ref=ref, payload=payload, memberKey=member_key)


def _lease_value(lease_id: str, answer: Any) -> Any:
    try:
        return protocol.LeaseValue.model_validate(answer or {}).value
    except ValidationError as exc:
        raise PermanentError(f"{lease_id} read answered something unreadable: {exc}") from exc


# -- manifests ---------------------------------------------------------------------------


def cache_path(base_dir: str, name: str) -> Path:
    return Path(base_dir) / ".roadie" / "manifests" / f"{name}.json"


async def fetch_manifest(transport: PushTransport) -> protocol.Manifest:
    try:
        status, body = await transport.request("GET", protocol.MANIFEST, None, protocol.NO_KEY)
        body = judge(transport.name, "manifest", status, body)
    except StepError as exc:
        if await _speaks_v1(transport):
            raise ConfigError(f"module {transport.name!r} at {transport.settings.url}: {protocol.V1_RETIRED}") from exc
        raise
    try:
        return protocol.Manifest.model_validate(body)
    except ValidationError as exc:
        raise ConfigError(f"module {transport.name!r} sent a manifest that is not valid: {exc}") from exc


async def _speaks_v1(transport: PushTransport) -> bool:
    """Whether the server behind a failed manifest answers version 1's manifest path: a
    module to be told, in one line, what to change, rather than left with a bare error."""
    path = f"{protocol.RETIRED_PREFIX}/manifest"
    headers = protocol.sign(transport.settings.secret, "GET", path, b"", key=protocol.NO_KEY)
    try:
        response = await transport.client.get(path, headers=headers)
    except httpx2.HTTPError:
        return False
    return response.status_code in (200, 401)


def read_cached(base_dir: str, name: str) -> protocol.Manifest | None:
    path = cache_path(base_dir, name)
    if not path.exists():
        return None
    try:
        return protocol.Manifest.model_validate_json(path.read_text())
    except (ValidationError, OSError):
        return None


def write_cached(base_dir: str, manifest: protocol.Manifest) -> None:
    path = cache_path(base_dir, manifest.module)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(manifest.model_dump_json(indent=2))
        tmp.replace(path)
    except OSError as exc:  # a cache is a convenience: an unwritable one is only a warning
        log.warning("manifest not cached", module=manifest.module, error=str(exc))


def _checked(manifest: protocol.Manifest, name: str) -> protocol.Manifest:
    if manifest.module != name:
        raise ConfigError(f"the server configured as module {name!r} says it is module {manifest.module!r}")
    return manifest


async def push_module(
    settings: RemoteSettings, base_dir: str, *, client: httpx2.AsyncClient | None = None, clock: Clock | None = None
) -> Module:
    """A push module: its manifest fetched from the server (and cached), else from the cache."""
    clock = clock or SystemClock()
    transport = PushTransport(settings, client=client, clock=clock)
    started = clock.now()
    try:
        manifest = _checked(await fetch_manifest(transport), settings.name)
        write_cached(base_dir, manifest)
        seconds = (clock.now() - started).total_seconds()
        log.debug("manifest fetched", module=settings.name, seconds=round(seconds, 3))
    except (StepError, ConfigError) as exc:
        cached = read_cached(base_dir, settings.name)
        if cached is None or isinstance(exc, ConfigError):
            await transport.close()
            raise ConfigError(f"module {settings.name!r}: no manifest: {exc.message}") from exc
        log.warning("module unreachable; using its cached manifest", module=settings.name, error=exc.message)
        manifest = _checked(cached, settings.name)
    return RemoteModule(manifest, transport, clock=clock).build()

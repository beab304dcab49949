"""Module servers for the conformance tests: the SDK serving the sandbox, and the same
server deliberately broken, one rule per flag.

`Broken` is an ASGI app in front of a `ModuleServer`: it checks signatures (or not) and
hands each call to `ModuleServer.handle`, changing the request or the reply where a flag
says so. Each flag breaks one rule of docs/protocol.md in the way a real module might.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from roadie import protocol
from roadie.modules.sandbox import SandboxWorld
from roadie.modules.sandbox import module as sandbox
from roadie.plugin.server import ModuleServer, Reply
from roadie.registry.module import LeaseCall, maybe_await

SECRET = "conformance-test-secret"
URL = "http://sandbox.test"

# flag -> the rule it breaks
BREAKS = {
    "bad_schema": "manifest",
    "no_key_ledger": "same_key",
    "inspect_not_ours": "inspect",
    "revert_key_noop": "revert_by_key",
    "revert_ignores_tag": "foreign_tag",
    "revert_missing_fails": "revert_missing",
    "accept_unsigned": "signature",
    "accept_stale": "signature",
    "accept_any_signature": "signature",
    "accept_replays": "signature",
    "accept_retargeted": "signature",
    "unsigned_answers": "signature",
    "answers_signed_for_another_request": "signature",
    "no_size_limit": "signature",
    "crash_on_bad_json": "malformed",
    "unknown_action_500": "malformed",
    "restore_noop": "lease_restore",
    "apply_after_restore": "lease_late_apply",
    "restore_first_read": "lease_layers",
    "ignores_fences": "stale_fence",
}
KINDS = {path: kind for kind, path in protocol.CALL_PATHS.items()}


class Broken:
    """An ASGI app: `server` behind the misbehaviours named by `flags` (see `BREAKS`)."""

    def __init__(self, server: ModuleServer, flags: Iterable[str] = (), *, busy_every: int = 0) -> None:
        self.server = server
        self.flags = set(flags)
        unknown = self.flags - set(BREAKS)
        assert not unknown, unknown
        self.busy_every = busy_every  # answer every n-th call 429 / 409 / 503, to test retries
        self.calls = 0
        self.fresh = 0
        self.first_read: dict[tuple[str, Any], Any] = {}  # (lease, target) -> the value its first read answered

    @property
    def world(self) -> SandboxWorld:
        assert isinstance(self.server.state, SandboxWorld)
        return self.server.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        request = Request(scope, receive)
        declared = int(request.headers.get("content-length", "0"))
        if declared > protocol.MAX_BODY_BYTES and "no_size_limit" not in self.flags:
            reply = Reply(413, protocol.error_body("over the limit"))
        else:
            body = await request.body()
            reply = await self.handle(request.method, request.url.path, dict(request.headers), body)
        response: Response = JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        request_id = request.headers.get(protocol.H_ID, "")
        if protocol.is_request_id(request_id) and "unsigned_answers" not in self.flags:
            if "answers_signed_for_another_request" in self.flags:
                request_id = protocol.new_id()
            response.headers.update(protocol.sign_answer(SECRET, request_id, request.url.path, bytes(response.body)))
        await response(scope, receive, send)

    def verify(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply | None:
        if "accept_unsigned" in self.flags:
            return None
        skew = math.inf if "accept_stale" in self.flags else protocol.MAX_SKEW
        if "accept_any_signature" in self.flags:
            # Fresh and present is all it asks: the HMAC itself is never compared.
            try:
                protocol.verify(SECRET, method, path, headers, body, max_skew=skew)
            except protocol.SignatureRefused as exc:
                if "wrong signature" not in exc.message:
                    return Reply(401, protocol.error_body(exc.message))
            return None
        try:
            signed = protocol.verify(SECRET, method, path, headers, body, max_skew=skew)
        except protocol.SignatureRefused as exc:
            if "accept_retargeted" not in self.flags or "wrong signature" not in exc.message:
                return Reply(401, protocol.error_body(exc.message))
            # Checks the signature over the body alone, whatever the path it came to.
            for other in KINDS:
                try:
                    signed = protocol.verify(SECRET, method, other, headers, body, max_skew=skew)
                    break
                except protocol.SignatureRefused:
                    continue
            else:
                return Reply(401, protocol.error_body(exc.message))
        if "accept_replays" in self.flags:
            return None
        if not self.server.ledger.first_sight(signed.id, signed.sent + protocol.MAX_SKEW):
            return Reply(401, protocol.error_body("replayed"))
        return None

    async def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        await self.server.open()
        refused = self.verify(method, path, headers, body)
        if refused is not None:
            return refused
        if method == "GET" and path == protocol.MANIFEST:
            manifest = self.server.manifest().model_dump(mode="json")
            if "bad_schema" in self.flags:
                manifest["actions"][0]["params"] = {"type": "no-such-type"}
            return Reply(200, manifest)
        kind = KINDS.get(path)
        if kind is None:
            return Reply(404, protocol.error_body(f"no such path {path!r}"))
        self.calls += 1
        if self.busy_every and self.calls % self.busy_every == 0:
            status = (429, 409, 503)[(self.calls // self.busy_every) % 3]
            return Reply(status, protocol.error_body("busy", retryable=True), {"Retry-After": "0"})
        try:
            request = json.loads(body)
        except ValueError:
            if "crash_on_bad_json" in self.flags:
                return Reply(500, protocol.error_body("JSONDecodeError", retryable=True))
            return await self.server.handle(kind, body)  # type: ignore[arg-type]
        if not isinstance(request, dict):
            return await self.server.handle(kind, body)  # type: ignore[arg-type]
        changed = await self.misbehave(kind, request)
        if changed is not None:
            return changed
        return await self.server.handle(kind, json.dumps(request).encode())  # type: ignore[arg-type]

    async def misbehave(self, kind: str, request: dict[str, Any]) -> Reply | None:
        """Change `request` in place, or answer instead of the server."""
        flags = self.flags
        resources = request.get("resources") or []
        if "ignores_fences" in flags and "fence" in request:
            # A v1 module moved to the v2 paths and nothing else: it reads no fence, so
            # every call is carried out as the first owner's would be.
            request["fence"] = protocol.MAX_FENCE
        if kind == "dispatch":
            if "unknown_action_500" in flags and request.get("action") not in self.server.module.actions:
                return Reply(500, protocol.error_body("KeyError", retryable=True))
            if "no_key_ledger" in flags and isinstance(request.get("idempotency_key"), str):
                self.fresh += 1
                request["idempotency_key"] += f"-{self.fresh}"  # a fresh act every time
        if kind == "inspect" and "inspect_not_ours" in flags:
            reply = await self.server.handle("inspect", json.dumps(request).encode())
            if reply.status == 200:
                for entry in reply.body["resources"]:
                    entry["ours"] = False
            return reply
        if kind == "revert":
            if "revert_key_noop" in flags and not resources:
                return Reply(200, {"failures": []})
            if "revert_ignores_tag" in flags and resources:
                for r in resources:
                    self.world.destroy(r["ref"])
                return Reply(200, {"failures": []})
            if "revert_missing_fails" in flags and resources:
                found = self.world.inspect([(r["kind"], r["ref"]) for r in resources])
                missing = [r for r, (exists, _tag) in zip(resources, found, strict=True) if not exists]
                if missing:
                    failures = [{"kind": r["kind"], "ref": r["ref"], "message": "no such object"} for r in missing]
                    return Reply(200, {"failures": failures})
        if kind == "lease.restore" and "restore_noop" in flags:
            return Reply(200, {})
        if "restore_first_read" in flags and kind in ("lease.read", "lease.restore"):
            # Gives back what it saved at the first read of the setting, whatever value the
            # engine sends: right for one borrow at a time, wrong for a stack's layers.
            where = (request["lease"], request.get("target"))
            if kind == "lease.restore" and where in self.first_read:
                request["value"] = self.first_read.pop(where)
            elif kind == "lease.read" and where not in self.first_read:
                reply = await self.server.handle("lease.read", json.dumps(request).encode())
                self.first_read[where] = reply.body.get("value") if reply.status == 200 else None
                return reply
        if kind == "lease.apply" and "apply_after_restore" in flags:
            # No key ledger for leases: every apply writes the world, even one that comes
            # after the restore of its borrow.
            lease = self.server.module.leases[request["lease"]]
            assert lease.write_fn is not None
            call = LeaseCall(
                lease=lease.name,
                target=request.get("target"),
                state=self.server.state,
                clock=self.server.clock,
                idempotency_key=request.get("idempotency_key"),
                run_id=request.get("run_id"),
            )
            await maybe_await(lease.write_fn(call, request.get("value")))
            return Reply(200, {})
        return None


def sandbox_server(home: Path) -> ModuleServer:
    """The SDK's server for the sandbox world, its world and key ledger under `home`."""
    return ModuleServer(
        sandbox, secret=SECRET, ledger_path=str(home / "keys.db"), settings={"db": "world.db"}, base_dir=str(home)
    )


@asynccontextmanager
async def serving(app: Any, server: ModuleServer) -> AsyncIterator[httpx.AsyncBaseTransport]:
    """An in-process transport to `app`, with `server` open for the duration."""
    async with server:
        yield httpx.ASGITransport(app=app)

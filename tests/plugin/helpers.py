"""Drive a `ModuleServer` over its ASGI app, signed as the engine signs, in the test's loop.

`Served` opens a server for a module (the sandbox world by default) on files in a temp
dir, and an httpx client wired to its app; `probe` is a tiny ledger module whose
behaviour each dispatch chooses (answer, fail retryably, raise, block on a gate).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from roadie import protocol
from roadie.errors import PermanentError, RetryableError
from roadie.modules import sandbox
from roadie.modules.sandbox import SandboxWorld
from roadie.plugin import Faults, ModuleServer
from roadie.registry import Answer, Call, Module, ModuleConfig, RevertCall

SECRET = "plugin-test-secret"


def raw(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def dispatch_body(
    key: str, action: str = "spawn", *, attempt: int = 1, fence: int = 1, **params: Any
) -> dict[str, Any]:
    if action == "spawn" and not params:
        params = {"kind": "orc", "region": "britain", "count": 2}
    return {
        "action": action,
        "run_id": 1,
        "step_id": 1,
        "idempotency_key": key,
        "attempt": attempt,
        "params": params,
        "fence": fence,
    }


def revert_body(
    key: str, action: str = "spawn", resources: list[dict[str, Any]] | None = None, *, fence: int = 1
) -> dict[str, Any]:
    return {"action": action, "run_id": 1, "idempotency_key": key, "resources": resources or [], "fence": fence}


class Served:
    """A module server on files under `home`, and a signed client for it."""

    def __init__(
        self,
        home: Path,
        module: Module = sandbox.module,
        *,
        faults: Faults | None = None,
        ledger: str = "keys.db",
        **kw: Any,
    ) -> None:
        self.server = ModuleServer(
            module,
            secret=SECRET,
            ledger_path=str(home / ledger),
            settings={"db": "world.db"},
            base_dir=str(home),
            faults=faults,
            **kw,
        )
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.server.app()), base_url="http://module")

    async def __aenter__(self) -> Served:
        await self.server.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.server.close()

    @property
    def world(self) -> SandboxWorld:
        world = self.server.state
        assert isinstance(world, SandboxWorld)
        return world

    async def post(
        self,
        path: str,
        body: Any,
        *,
        secret: str = SECRET,
        now: float | None = None,
        sent: bytes | None = None,
    ) -> httpx.Response:
        """POST `body` signed with `secret` at `now`; `sent` replaces the bytes actually sent."""
        content = raw(body)
        headers = protocol.sign(secret, "POST", path, content, now=now)
        return await self.http.post(path, content=content if sent is None else sent, headers=headers)

    async def get(self, path: str, *, signed: bool = True) -> httpx.Response:
        headers = protocol.sign(SECRET, "GET", path, b"") if signed else {}
        return await self.http.get(path, headers=headers)

    async def dispatch(self, key: str, action: str = "spawn", **params: Any) -> httpx.Response:
        return await self.post(protocol.DISPATCH, dispatch_body(key, action, **params))

    async def revert(
        self, key: str, action: str = "spawn", resources: list[dict[str, Any]] | None = None
    ) -> httpx.Response:
        return await self.post(protocol.REVERT, revert_body(key, action, resources))

    def creations(self, key: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.world.effects() if e["op"] == "create" and (key is None or e["key"] == key)]


def signed_now() -> float:
    return time.time()


# -- the probe module ---------------------------------------------------------------------


class ProbeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str = "ok"


@dataclass
class ProbeState:
    calls: list[tuple[str, int]] = field(default_factory=list)
    reverts: list[tuple[str, list[str]]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    entered: asyncio.Event | None = None


probe = Module("probe", "answers as each dispatch asks")


@probe.setup
def _setup(config: ModuleConfig) -> ProbeState:
    return ProbeState()


@probe.action("act", reversible="ledger", params=ProbeParams)
async def act(call: Call[ProbeParams]) -> Answer:
    state: ProbeState = call.state
    state.calls.append((call.idempotency_key, call.attempt))
    mode = call.params.mode
    if mode == "retry":
        raise RetryableError("probe is busy", next_retry_delay=2.5)
    if mode == "permanent":
        raise PermanentError("probe refuses")
    if mode == "boom":
        raise ValueError("probe exploded")
    if mode == "block":
        assert state.gate is not None
        assert state.entered is not None
        state.entered.set()
        await state.gate.wait()
    return Answer(resources=[{"kind": "thing", "ref": f"t-{call.idempotency_key}"}], output={"mode": mode})


@act.revert
def _undo(call: RevertCall) -> None:
    state: ProbeState = call.state
    state.reverts.append((call.idempotency_key, [r.ref for r in call.resources]))

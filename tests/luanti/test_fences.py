"""Fences against the real mod (roadie/v2): a call under a fence older than one the mod
has accepted for its target comes from an owner whose claim has lapsed, and is refused
with 412 "superseded", doing nothing, even after the server is killed and started again.
The calls are put on the engine's own work queue (the conformance kit's pull side), so
the test chooses each call's fence."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from roadie.conformance.pull import QueueTransport, serve_queue
from roadie.conformance.session import ConformanceOptions
from roadie.conformance.transport import Kind
from tests.luanti.harness import SECRET, Luanti, require_luanti
from tests.remote.servers import free_port

pytestmark = pytest.mark.timeout(400)  # a real server started twice, on a busy machine

KEY = "run1-fenced_wave"


def _spawn(fence: int) -> dict[str, Any]:
    return {
        "action": "spawn", "run_id": 1, "step_id": 1, "idempotency_key": KEY, "attempt": 1,
        "params": {"pos": {"x": 0, "y": 1, "z": 0}, "kind": "fenced", "count": 2}, "fence": fence,
    }  # fmt: skip


def _motd(kind: str, key: str, value: Any, fence: int | None) -> dict[str, Any]:
    body = {"lease": "setting", "target": "motd", "run_id": 1, "idempotency_key": key, "value": value}
    return body if fence is None else {**body, "fence": fence}


async def _call(transport: QueueTransport, kind: Kind, body: dict[str, Any]) -> tuple[int, Any]:
    """One call, again while the mod answers 503 (the area is being loaded)."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        status, answer = await transport.call(kind, body)
        if status != 503 or asyncio.get_running_loop().time() > deadline:
            return status, answer
        await asyncio.sleep(0.2)  # the mod said: try again; it loads the area meanwhile


async def _ours(luanti: Luanti) -> list[Any]:
    seen = await asyncio.to_thread(luanti.look)
    assert seen is not None
    return [c for c in seen["creatures"] if c["key"] == KEY]


def _superseded(status: int, answer: Any, mark: int) -> bool:
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    return status == 412 and error.get("code") == "superseded" and error.get("fence") == mark


async def _check(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    options = ConformanceOptions(pull=True, module="luanti", timeout=60, announce_timeout=120)
    async with serve_queue(url, SECRET, options) as transport:
        luanti = Luanti(tmp_path / "luanti", url)
        try:
            luanti.start()
            await asyncio.to_thread(luanti.ready)

            status, first = await _call(transport, "dispatch", _spawn(5))
            assert status == 200, first
            assert len(first["resources"]) == 2, first
            assert len(await _ours(luanti)) == 2

            # The same step from a worker whose claim lapsed before the fence-5 owner's.
            status, answer = await _call(transport, "dispatch", _spawn(3))
            assert _superseded(status, answer, 5), (status, answer)
            status, answer = await _call(transport, "revert", {**_spawn(4), "resources": []})
            assert _superseded(status, answer, 5), (status, answer)
            assert len(await _ours(luanti)) == 2, "a stale call spawned or reverted something"
            status, again = await _call(transport, "dispatch", _spawn(5))
            assert (status, again) == (200, first), "an equal fence (a retry) gets the stored answer"

            # A borrow's apply delivered after a newer owner's restore: refused, motd kept.
            assert (await _call(transport, "lease.read", _motd("read", "b1", None, None)))[0] == 200
            assert (await _call(transport, "lease.apply", _motd("apply", "b1", "Raid!", 5)))[0] == 200
            restored = await _call(transport, "lease.restore", _motd("restore", "r1", "Welcome to the arena", 7))
            assert restored[0] == 200, restored
            status, answer = await _call(transport, "lease.apply", _motd("apply", "b2", "Stale raid!", 6))
            assert _superseded(status, answer, 7), (status, answer)
            seen = await asyncio.to_thread(luanti.look)
            assert seen is not None
            assert seen["settings"]["motd"] == "Welcome to the arena"

            # The marks are in the journal: a server killed and started again keeps them.
            luanti.kill()
            luanti.start()
            await asyncio.to_thread(luanti.ready)
            status, answer = await _call(transport, "dispatch", _spawn(4))
            assert _superseded(status, answer, 5), (status, answer)
            status, answer = await _call(transport, "lease.apply", _motd("apply", "b3", "Stale raid!", 6))
            assert _superseded(status, answer, 7), (status, answer)
            # (What the kill did to the creatures is the verification's business, not this test's.)
        except BaseException:
            print("--- luanti log ---\n" + luanti.log_tail(60))
            raise
        finally:
            luanti.stop()


def test_the_mod_refuses_a_stale_fence_and_does_nothing_even_after_a_restart(tmp_path: Path) -> None:
    require_luanti()
    asyncio.run(_check(tmp_path))

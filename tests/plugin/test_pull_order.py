"""The pull client runs the calls of one key, or of one lease target, one at a time and in
queue order, and other calls beside them.

Calls here are held on gates the test opens, so which call runs when is decided by the
test, not by the machine's speed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from roadie.plugin import PullClient
from roadie.registry import LeaseCall, Module, ModuleConfig
from tests.plugin.test_pull import ENGINE, FakeGateway


@dataclass
class Gated:
    """A world of one setting per target, whose writes wait on a gate when one is set."""

    values: dict[str, Any] = field(default_factory=lambda: {"britain": "clear", "yew": "clear"})
    gates: dict[str, asyncio.Event] = field(default_factory=dict)  # value -> the gate its write waits on
    entered: dict[str, asyncio.Event] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


# The fake gateway only speaks to a module called `sandbox`.
gated = Module("sandbox", "a setting per region whose writes the test holds")


@gated.setup
def _setup(_config: ModuleConfig) -> Gated:
    return Gated()


@gated.lease("weather", targeted=True)
def _read(call: LeaseCall) -> Any:
    world: Gated = call.state
    return world.values[str(call.target)]


@_read.write
async def _write(call: LeaseCall, value: Any) -> None:
    world: Gated = call.state
    world.log.append(f"start {call.target}={value}")
    world.entered.setdefault(str(value), asyncio.Event()).set()
    gate = world.gates.get(str(value))
    if gate is not None:
        await gate.wait()
    world.values[str(call.target)] = value
    world.log.append(f"end {call.target}={value}")


def lease_body(key: str, value: Any = None, *, target: str = "britain") -> dict[str, Any]:
    return {"lease": "weather", "target": target, "run_id": 7, "idempotency_key": key, "value": value, "fence": 1}


def test_an_apply_and_its_restore_in_one_batch_run_in_queue_order(tmp_path: Path) -> None:
    """One poll hands out a borrow's apply (held on a gate) and the restore of the same
    target: the restore waits for the apply to end, so the restored value is what stays.
    A call for another target runs meanwhile."""

    async def body() -> None:
        gateway = FakeGateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            client = PullClient(gated, ENGINE, "plugin-test-secret", str(tmp_path / "keys.db"), wait=0.2, http=http)
            running = asyncio.create_task(client.run())
            await asyncio.wait_for(client.announced.wait(), 10)
            # The borrow's read first, alone, so its key is known to the ledger.
            read = gateway.put("lease.read", lease_body("k-storm"))
            await gateway.wait_answers(read)

            world: Gated = client.server.state
            world.gates["storm"] = asyncio.Event()
            world.entered["storm"] = asyncio.Event()
            apply = gateway.put("lease.apply", lease_body("k-storm", "storm"))
            restore = gateway.put("lease.restore", lease_body("restore-7-1", "clear"))
            other = gateway.put("lease.apply", lease_body("k-yew", "rain", target="yew"))
            await asyncio.wait_for(world.entered["storm"].wait(), 10)
            await gateway.wait_answers(other)  # another target is not held up
            assert restore not in gateway.answers
            assert world.values["britain"] == "clear"  # not written yet: the apply is held

            world.gates["storm"].set()
            await gateway.wait_answers(apply, restore)
            assert [gateway.answers[i][0].status for i in (apply, restore, other)] == [200, 200, 200]
            britain = [entry for entry in world.log if "britain" in entry]
            assert britain == ["start britain=storm", "end britain=storm", "start britain=clear", "end britain=clear"]
            assert world.values == {"britain": "clear", "yew": "rain"}
            client.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(body())


def test_two_calls_of_one_key_in_one_batch_run_in_order(tmp_path: Path) -> None:
    """Two deliveries of one apply in one poll run one after the other: the second finds
    the first's stored answer, and the world is written once."""

    async def body() -> None:
        gateway = FakeGateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            client = PullClient(gated, ENGINE, "plugin-test-secret", str(tmp_path / "keys.db"), wait=0.2, http=http)
            running = asyncio.create_task(client.run())
            await asyncio.wait_for(client.announced.wait(), 10)
            world: Gated = client.server.state
            world.gates["storm"] = asyncio.Event()
            world.entered["storm"] = asyncio.Event()
            first = gateway.put("lease.apply", lease_body("k-storm", "storm"))
            second = gateway.put("lease.apply", lease_body("k-storm", "storm"), delivery=2)
            await asyncio.wait_for(world.entered["storm"].wait(), 10)
            world.gates["storm"].set()
            await gateway.wait_answers(first, second)
            assert [gateway.answers[i][0].status for i in (first, second)] == [200, 200]
            assert world.log == ["start britain=storm", "end britain=storm"]
            client.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(body())

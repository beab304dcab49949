"""Leases through the plugin-side key ledger: a borrow's apply is carried out once per key,
and never after its borrow was given back, on either transport.

The engine borrows with the step's key (a read, then an apply) and gives the value back
with a restore under a key of its own, naming the same run, lease and target. A queued
apply redelivered, or a slow request, can reach the module after that restore: it must
not write the borrowed value over the restored one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from roadie import protocol
from roadie.modules import sandbox
from roadie.plugin import PullClient
from tests.plugin.helpers import Served
from tests.plugin.test_pull import ENGINE, FakeGateway


def lease_body(
    key: str, value: Any = None, *, target: str = "britain", run_id: int = 7, fence: int = 1
) -> dict[str, Any]:
    """A lease call's body; a read sends the fence too, which the module ignores."""
    body = {"lease": "weather", "target": target, "run_id": run_id, "idempotency_key": key, "value": value}
    return {**body, "fence": fence}


def test_a_stale_apply_after_its_restore_does_not_change_the_world_push(tmp_path: Path) -> None:
    """Push: read, apply, restore; then the same apply again (a slow duplicate) is refused
    with a permanent 422 that says why, and the world keeps the restored value."""

    async def body() -> None:
        async with Served(tmp_path) as served:
            assert (await served.post(protocol.LEASE_READ, lease_body("run7-storm"))).json() == {"value": "clear"}
            assert (await served.post(protocol.LEASE_APPLY, lease_body("run7-storm", "storm"))).status_code == 200
            restored = await served.post(protocol.LEASE_RESTORE, lease_body("restore-7-12", "clear"))
            assert restored.status_code == 200
            assert served.world.read_weather("britain") == "clear"

            late = await served.post(protocol.LEASE_APPLY, lease_body("run7-storm", "storm"))
            assert late.status_code == 422
            error = late.json()["error"]
            assert error["retryable"] is False
            assert error["field"] == "idempotency_key"
            assert "given back" in error["message"]
            assert served.world.read_weather("britain") == "clear"

    asyncio.run(body())


def test_a_repeated_apply_returns_its_stored_answer_without_writing_again(tmp_path: Path) -> None:
    """An apply whose key was carried out answers its stored answer and leaves the world
    alone: a value someone changed by hand since is not overwritten by the duplicate."""

    async def body() -> None:
        async with Served(tmp_path) as served:
            await served.post(protocol.LEASE_READ, lease_body("k-borrow"))
            assert (await served.post(protocol.LEASE_APPLY, lease_body("k-borrow", "storm"))).status_code == 200
            served.world.set_weather("britain", "fog")  # a game master, by hand
            again = await served.post(protocol.LEASE_APPLY, lease_body("k-borrow", "storm"))
            assert (again.status_code, again.json()) == (200, {})
            assert served.world.read_weather("britain") == "fog"

    asyncio.run(body())


def test_an_apply_that_shared_a_given_back_borrow_is_refused_but_a_new_borrow_is_not(tmp_path: Path) -> None:
    """A second borrow of a target the run holds skips the read, so its key is first seen
    at its apply: after the run's borrow was given back, that apply lost the race and is
    refused. A new borrow by the same run reads first, and is carried out."""

    async def body() -> None:
        async with Served(tmp_path) as served:
            await served.post(protocol.LEASE_READ, lease_body("k-first"))
            await served.post(protocol.LEASE_APPLY, lease_body("k-first", "storm"))
            await served.post(protocol.LEASE_RESTORE, lease_body("restore-7-1", "clear"))

            shared = await served.post(protocol.LEASE_APPLY, lease_body("k-second", "rain"))
            assert shared.status_code == 422
            assert served.world.read_weather("britain") == "clear"

            await served.post(protocol.LEASE_READ, lease_body("k-later"))
            assert (await served.post(protocol.LEASE_APPLY, lease_body("k-later", "snow"))).status_code == 200
            assert served.world.read_weather("britain") == "snow"
            # Another run's borrow of another region is not touched by run 7's restore.
            await served.post(protocol.LEASE_READ, lease_body("k-other", target="yew", run_id=8))
            other = await served.post(protocol.LEASE_APPLY, lease_body("k-other", "storm", target="yew", run_id=8))
            assert other.status_code == 200

    asyncio.run(body())


def test_a_restore_replayed_after_another_borrow_leaves_the_new_value(tmp_path: Path) -> None:
    """A restore delivered again after another run borrowed the target since does not give
    the old value back over the new borrow (DESIGN §10)."""

    async def body() -> None:
        async with Served(tmp_path) as served:
            await served.post(protocol.LEASE_READ, lease_body("k-a", run_id=1))
            await served.post(protocol.LEASE_APPLY, lease_body("k-a", "storm", run_id=1))
            await served.post(protocol.LEASE_RESTORE, lease_body("restore-1-1", "clear", run_id=1))
            await served.post(protocol.LEASE_READ, lease_body("k-b", run_id=2))
            await served.post(protocol.LEASE_APPLY, lease_body("k-b", "rain", run_id=2))

            replayed = await served.post(protocol.LEASE_RESTORE, lease_body("restore-1-1", "clear", run_id=1))
            assert (replayed.status_code, replayed.json()) == (200, {})
            assert served.world.read_weather("britain") == "rain"

    asyncio.run(body())


def test_a_stale_apply_pulled_after_its_restore_does_not_change_the_world(tmp_path: Path) -> None:
    """Pull: the gateway hands out the borrow, then its restore, then the borrow's apply
    again (a redelivery the module never should have got). The late apply is answered
    422, and the world keeps the restored value."""

    async def body() -> None:
        gateway = FakeGateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            client = PullClient(
                sandbox.module,
                ENGINE,
                "plugin-test-secret",
                str(tmp_path / "keys.db"),
                settings={"db": "world.db"},
                base_dir=str(tmp_path),
                wait=0.2,
                http=http,
            )
            running = asyncio.create_task(client.run())
            read = gateway.put("lease.read", lease_body("run7-storm"))
            apply = gateway.put("lease.apply", lease_body("run7-storm", "storm"))
            await gateway.wait_answers(read, apply)
            restore = gateway.put("lease.restore", lease_body("restore-7-12", "clear"))
            await gateway.wait_answers(restore)
            late = gateway.put("lease.apply", lease_body("run7-storm", "storm"), delivery=2, id=apply)
            await gateway.wait_answers(late)
            while len(gateway.answers[apply]) < 2:
                gateway.answered.clear()
                await asyncio.wait_for(gateway.answered.wait(), 10)
            assert [a.status for a in gateway.answers[apply]] == [200, 422]
            assert client.server.state.read_weather("britain") == "clear"
            client.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(body())

"""Fences through the plugin SDK (docs/protocol.md §4, rule 7): per step key and per lease
target the key ledger keeps the highest fence it accepted, refuses a lower one with 412
`superseded` before any other rule (a stored answer is not replayed to it), accepts an
equal one (a retry), and keeps its marks across a restart; on both transports."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from roadie import protocol
from roadie.plugin import KeyLedger, PullClient
from tests.plugin.helpers import Served, dispatch_body, revert_body
from tests.plugin.test_lease_ledger import lease_body
from tests.plugin.test_pull import FakeGateway, _client


def superseded(response: httpx.Response, mark: int) -> bool:
    body = response.json()
    return (
        response.status_code == protocol.SUPERSEDED
        and protocol.is_superseded(response.status_code, body)
        and body["error"]["field"] == "fence"
        and body["error"]["fence"] == mark
    )


def test_a_dispatch_under_a_lower_fence_is_refused_before_its_stored_answer(tmp_path: Path) -> None:
    """A key dispatched under fence 5 answers a copy under fence 4 with 412 and its mark,
    not with the stored answer, and makes nothing; under 5 again (a retry) it gets the
    stored answer; a newer owner's fence 6 gets it too, and raises the mark."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            first = await s.post(protocol.DISPATCH, dispatch_body("k1", fence=5))
            assert first.status_code == 200
            stale = await s.post(protocol.DISPATCH, dispatch_body("k1", attempt=2, fence=4))
            assert superseded(stale, 5), stale.text
            assert "resources" not in stale.json()
            assert len(s.creations("k1")) == 2
            retry = await s.post(protocol.DISPATCH, dispatch_body("k1", attempt=2, fence=5))
            assert (retry.status_code, retry.json()) == (200, first.json())
            newer = await s.post(protocol.DISPATCH, dispatch_body("k1", attempt=3, fence=6))
            assert (newer.status_code, newer.json()) == (200, first.json())
            assert superseded(await s.post(protocol.DISPATCH, dispatch_body("k1", fence=5)), 6)
            assert len(s.creations("k1")) == 2
            assert s.server.ledger.mark("key", "k1") == 6

    asyncio.run(body())


def test_a_stale_dispatch_of_a_new_key_is_not_refused_and_runs_once(tmp_path: Path) -> None:
    """Marks are per key: a low fence on a key never seen is the first owner's."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            assert (await s.post(protocol.DISPATCH, dispatch_body("k-high", fence=90))).status_code == 200
            assert (await s.post(protocol.DISPATCH, dispatch_body("k-low", fence=2))).status_code == 200
            assert len(s.creations("k-low")) == 2

    asyncio.run(body())


def test_a_revert_under_a_lower_fence_removes_nothing_and_tombstones_nothing(tmp_path: Path) -> None:
    """A step dispatched under fence 8 is not reverted by a cleanup whose fence is 7: 412,
    the creatures stay, and the key is not tombstoned (a retry under 8 is answered). The
    cleanup that holds fence 9 reverts it; a dispatch under 8 after that is refused."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            made = (await s.post(protocol.DISPATCH, dispatch_body("k1", fence=8))).json()["resources"]
            stale = await s.post(protocol.REVERT, revert_body("k1", resources=made, fence=7))
            assert superseded(stale, 8), stale.text
            assert len(s.world.snapshot()["creatures"]) == 2
            entry = s.server.ledger.entry("k1")
            assert entry is not None
            assert not entry.reverted
            by_key = await s.post(protocol.REVERT, revert_body("k1", fence=7))
            assert superseded(by_key, 8)
            assert len(s.world.snapshot()["creatures"]) == 2
            assert (await s.post(protocol.DISPATCH, dispatch_body("k1", attempt=2, fence=8))).status_code == 200

            reverted = await s.post(protocol.REVERT, revert_body("k1", resources=made, fence=9))
            assert (reverted.status_code, reverted.json()) == (200, {"failures": []})
            assert s.world.snapshot()["creatures"] == {}
            assert superseded(await s.post(protocol.DISPATCH, dispatch_body("k1", attempt=3, fence=8)), 9)

    asyncio.run(body())


def test_a_lease_write_under_a_lower_fence_leaves_the_value(tmp_path: Path) -> None:
    """Fences on leases are counted per lease target, whatever the key: an apply and a
    restore under a fence lower than the target's mark write nothing; an equal fence (the
    same owner's restore) writes; another target is not fenced by this one."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            await s.post(protocol.LEASE_READ, lease_body("k-storm"))
            assert (await s.post(protocol.LEASE_APPLY, lease_body("k-storm", "storm", fence=3))).status_code == 200
            await s.post(protocol.LEASE_READ, lease_body("k-fog"))
            stale_apply = await s.post(protocol.LEASE_APPLY, lease_body("k-fog", "fog", fence=2))
            assert superseded(stale_apply, 3), stale_apply.text
            assert "weather#britain" in stale_apply.json()["error"]["message"]
            stale_restore = await s.post(protocol.LEASE_RESTORE, lease_body("restore-7-1", "clear", fence=2))
            assert superseded(stale_restore, 3)
            assert s.world.read_weather("britain") == "storm"

            await s.post(protocol.LEASE_READ, lease_body("k-yew", target="yew"))
            yew = await s.post(protocol.LEASE_APPLY, lease_body("k-yew", "rain", target="yew", fence=1))
            assert yew.status_code == 200

            restored = await s.post(protocol.LEASE_RESTORE, lease_body("restore-7-1", "clear", fence=3))
            assert restored.status_code == 200
            assert s.world.read_weather("britain") == "clear"
            assert s.server.ledger.mark("lease", "weather#britain") == 3
            assert s.server.ledger.mark("lease", "weather#yew") == 1

    asyncio.run(body())


def test_a_call_without_a_fence_or_with_one_out_of_range_is_400(tmp_path: Path) -> None:
    async def body() -> None:
        async with Served(tmp_path) as s:
            for fence in (None, 0, -1, protocol.MAX_FENCE + 1, 1.5, [3]):
                sent: dict[str, Any] = dispatch_body(f"k-{fence}")
                if fence is None:
                    del sent["fence"]
                else:
                    sent["fence"] = fence
                refused = await s.post(protocol.DISPATCH, sent)
                assert refused.status_code == 400, (fence, refused.text)
                assert refused.json()["error"]["field"] == "fence"
            no_fence = {k: v for k, v in revert_body("k1").items() if k != "fence"}
            assert (await s.post(protocol.REVERT, no_fence)).json()["error"]["field"] == "fence"
            for path in (protocol.LEASE_APPLY, protocol.LEASE_RESTORE):
                bare = {k: v for k, v in lease_body("k1", "storm").items() if k != "fence"}
                refused = await s.post(path, bare)
                assert (refused.status_code, refused.json()["error"]["field"]) == (400, "fence")
            read = {k: v for k, v in lease_body("k1").items() if k != "fence"}
            assert (await s.post(protocol.LEASE_READ, read)).status_code == 200  # a read carries none
            assert (
                await s.post(protocol.DISPATCH, dispatch_body("k-max", fence=protocol.MAX_FENCE))
            ).status_code == 200
            assert s.world.snapshot()["regions"]["britain"] == "clear"
            assert [e["key"] for e in s.creations()] == ["k-max", "k-max"]

    asyncio.run(body())


def test_marks_survive_reopening_the_ledger(tmp_path: Path) -> None:
    """The marks are in the ledger's file: a restarted server (a new ledger object on the
    same file) refuses what the one before it would have."""
    path = str(tmp_path / "keys.db")
    with KeyLedger(path) as ledger:
        assert ledger.begin("k1", "spawn", fence=7).run
        ledger.finish("k1", {"resources": [], "output": None})
        assert ledger.begin_apply("k2", "weather", "britain", 1, fence=4).run
        assert ledger.begin_restore("r1", "xp_rate", None, 1, fence=9).run
    with KeyLedger(path) as ledger:
        assert ledger.begin("k1", "spawn", fence=6).superseded == 7
        assert ledger.begin_revert("k1", "spawn", fence=6).superseded == 7
        assert ledger.begin_apply("k3", "weather", "britain", 1, fence=3).superseded == 4
        assert ledger.begin_restore("r2", "xp_rate", None, 1, fence=8).superseded == 9
        assert ledger.begin("k1", "spawn", fence=7).stored
        assert (ledger.mark("key", "k1"), ledger.mark("lease", "weather#britain"), ledger.mark("lease", "xp_rate")) == (
            7,
            4,
            9,
        )
        # Keys and lease targets are counted apart, though they may be spelt alike.
        assert ledger.begin("xp_rate", "spawn", fence=1).run


def test_marks_survive_a_restart_of_the_server(tmp_path: Path) -> None:
    async def body() -> None:
        async with Served(tmp_path) as s:
            assert (await s.post(protocol.DISPATCH, dispatch_body("k1", fence=12))).status_code == 200
        async with Served(tmp_path) as s:
            assert superseded(await s.post(protocol.DISPATCH, dispatch_body("k1", fence=11)), 12)
            assert len(s.creations("k1")) == 2

    asyncio.run(body())


def test_a_superseded_raised_by_the_module_is_a_412(tmp_path: Path) -> None:
    """The sandbox keeps marks of its own, in its world file: a module that refuses a stale
    fence itself (the SDK's ledger was lost, the world's marks were not) answers 412 too."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            s.world.spawn("k1", "orc", "britain", 1, fence=20)
            refused = await s.post(protocol.DISPATCH, dispatch_body("k1", fence=19))
            assert refused.status_code == protocol.SUPERSEDED
            assert protocol.is_superseded(refused.status_code, refused.json())
            assert refused.json()["error"]["field"] == "fence"
            assert len(s.creations("k1")) == 1

    asyncio.run(body())


def test_pull_posts_the_412_answer_like_any_other(tmp_path: Path) -> None:
    """Pulled calls go through the same ledger: a dispatch under fence 5, then a copy under
    fence 4 (an old owner's call, still queued) is answered 412 superseded, posted back
    like any answer, and makes nothing; a lease apply likewise."""

    async def body() -> None:
        gateway = FakeGateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as http:
            client: PullClient = _client(tmp_path, http)
            running = asyncio.create_task(client.run())
            await asyncio.wait_for(client.announced.wait(), 10)
            first = gateway.put("dispatch", dispatch_body("k1", fence=5))
            stale = gateway.put("dispatch", dispatch_body("k1", attempt=2, fence=4))
            gateway.put("lease.read", lease_body("k-storm"))
            applied = gateway.put("lease.apply", lease_body("k-storm", "storm", fence=3))
            late = gateway.put("lease.apply", lease_body("k-storm", "hail", fence=2))
            await gateway.wait_answers(first, stale, applied, late)
            assert gateway.answers[first][0].status == 200
            [refused] = gateway.answers[stale]
            assert protocol.is_superseded(refused.status, refused.body)
            assert refused.body["error"]["fence"] == 5
            [refused_apply] = gateway.answers[late]
            assert protocol.is_superseded(refused_apply.status, refused_apply.body)
            assert refused_apply.body["error"]["fence"] == 3
            world = client.server.state
            assert len([e for e in world.effects() if e["op"] == "create"]) == 2
            assert world.read_weather("britain") == "storm"
            client.stop()
            await asyncio.wait_for(running, 10)

    asyncio.run(body())

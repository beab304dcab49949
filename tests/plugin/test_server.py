"""The plugin SDK's push server over the sandbox world: signatures, statuses, and the key
ledger that makes every effect exactly-once although delivery is at-least-once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from roadie import protocol
from roadie.plugin import AnswerDropped, Faults, KeyLedger, KeyStatus
from tests.plugin.helpers import SECRET, ProbeState, Served, dispatch_body, probe


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def test_manifest_lists_actions_schemas_leases_and_inspect(tmp_path: Path) -> None:
    """The manifest says each action's class and parameter JSON Schema, each lease and
    whether it is targeted, and that the sandbox answers inspect."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            response = await s.get(protocol.MANIFEST)
            assert response.status_code == 200
            manifest = protocol.Manifest.model_validate(response.json())
            actions = {a.name: a for a in manifest.actions}
            assert manifest.module == "sandbox"
            assert actions["spawn"].reversible == "ledger"
            assert actions["broadcast"].reversible == "none"
            assert actions["buff"].reversible == "self"
            assert set(actions["spawn"].params["properties"]) == {"kind", "region", "count"}
            assert actions["spawn"].params["required"] == ["kind", "region"]
            assert {(lease.name, lease.targeted, lease.stacks) for lease in manifest.leases} == {
                ("weather", True, False),
                ("xp_rate", False, False),
                ("motd", False, True),
            }
            assert manifest.inspect is True

    run(body)


def test_refused_signatures_are_401_and_nothing_acts(tmp_path: Path) -> None:
    """Unsigned, wrongly signed, stale and tampered requests are refused with 401 and a
    message saying why; none of them reaches the world or the key ledger."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            good = dispatch_body("k1")
            unsigned = await s.http.post(protocol.DISPATCH, json=good)
            wrong = await s.post(protocol.DISPATCH, good, secret="not-the-secret")
            stale = await s.post(protocol.DISPATCH, good, now=time.time() - 400)
            tampered = await s.post(
                protocol.DISPATCH, good, sent=protocol_bytes(dispatch_body("k1", count=400, kind="orc", region="yew"))
            )
            manifest = await s.get(protocol.MANIFEST, signed=False)
            for response, words in (
                (unsigned, "unsigned"),
                (wrong, "wrong signature"),
                (stale, "stale"),
                (tampered, "wrong signature"),
                (manifest, "unsigned"),
            ):
                assert response.status_code == 401
                assert words in response.json()["error"]["message"]
            assert SECRET not in unsigned.text + wrong.text
            assert s.world.effects() == []
            assert s.server.ledger.entries() == []

    run(body)


def protocol_bytes(body: object) -> bytes:
    import json

    return json.dumps(body).encode()


def test_malformed_requests_are_400_or_422_and_nothing_acts(tmp_path: Path) -> None:
    """A body that is not JSON or misses a field is 400 naming the field; an unknown action
    is 404; parameters that fail the schema, or a PermanentError, are 422; no effect."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            not_json = await s.post(protocol.DISPATCH, b"{not json")
            assert not_json.status_code == 400
            assert "not JSON" in not_json.json()["error"]["message"]

            missing = dispatch_body("k1")
            del missing["idempotency_key"]
            no_key = await s.post(protocol.DISPATCH, missing)
            assert no_key.status_code == 400
            assert no_key.json()["error"]["field"] == "idempotency_key"

            unknown = await s.dispatch("k1", action="teleport")
            assert unknown.status_code == 404
            assert unknown.json()["error"]["field"] == "action"

            bad = await s.dispatch("k1", kind="orc", region="britain", count=0)
            assert bad.status_code == 422
            assert bad.json()["error"]["field"] == "params.count"
            assert bad.json()["error"]["retryable"] is False

            nowhere = await s.dispatch("k1", kind="orc", region="atlantis")
            assert nowhere.status_code == 422
            assert "atlantis" in nowhere.json()["error"]["message"]

            assert s.world.effects() == []
            # The refused call left its key re-tryable: the same key now does its work.
            assert (await s.dispatch("k1")).status_code == 200
            assert len(s.creations("k1")) == 2

    run(body)


def test_same_key_twice_answers_the_stored_answer_and_acts_once(tmp_path: Path) -> None:
    """A dispatch whose key's answer is stored gets that answer, and the world is not
    touched again; the key ledger holds the answer; another action under it is 422."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            first = await s.dispatch("k1")
            second = await s.dispatch("k1")
            assert first.status_code == second.status_code == 200
            assert first.json() == second.json()
            answer = first.json()
            assert [r["kind"] for r in answer["resources"]] == ["creature", "creature"]
            assert answer["output"] == {"serials": [r["ref"] for r in answer["resources"]]}
            assert len(s.creations()) == 2
            entry = s.server.ledger.entry("k1")
            assert entry is not None
            assert entry.status is KeyStatus.DONE
            assert entry.answer == answer
            assert entry.attempts == 1

            other = await s.dispatch("k1", action="broadcast", message="hi")
            assert other.status_code == 422
            assert "spawn" in other.json()["error"]["message"]
            assert s.world.broadcasts() == []

    run(body)


def test_twenty_concurrent_duplicates_act_once(tmp_path: Path) -> None:
    """Twenty copies of one dispatch at once run the action once and all get its answer."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            s.world.enable_dispatch_log()
            s.world.delay(0.05)  # hold the first call open while the others arrive
            responses = await asyncio.gather(
                *(s.dispatch("dup", kind="orc", region="britain", count=3) for _ in range(20))
            )
            assert {r.status_code for r in responses} == {200}
            assert len({r.text for r in responses}) == 1
            assert len(s.creations("dup")) == 3
            assert len(s.world.dispatches()) == 1

    run(body)


def test_revert_by_key_alone_reverts_what_the_key_produced(tmp_path: Path) -> None:
    """A revert with a key and no resources is given the stored answer's resources; a
    repeated revert is harmless; a late duplicate dispatch after the revert is refused."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            serials = [r["ref"] for r in (await s.dispatch("k1")).json()["resources"]]
            reverted = await s.revert("k1")
            assert reverted.status_code == 200
            assert reverted.json() == {"failures": []}
            assert s.world.snapshot()["creatures"] == {}
            removed = [e["ref"] for e in s.world.effects() if e["op"] == "remove"]
            assert sorted(removed) == sorted(serials)

            again = await s.revert("k1")
            assert again.status_code == 200
            entry = s.server.ledger.entry("k1")
            assert entry is not None
            assert entry.reverts == 2
            assert entry.reverted

            late = await s.dispatch("k1")
            assert late.status_code == 422
            assert "reverted" in late.json()["error"]["message"]
            assert s.world.snapshot()["creatures"] == {}
            assert len(s.creations()) == 2

    run(body)


def test_revert_of_a_crashed_dispatch_finds_its_objects_by_tag(tmp_path: Path) -> None:
    """An action that crashed midway stored no answer: revert by key passes `resources=[]`
    and the module removes what carries the key's tag."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            s.world.crash_next()
            crashed = await s.dispatch("k1", kind="orc", region="britain", count=4)
            assert crashed.status_code == 500
            assert crashed.json()["error"]["retryable"] is True
            assert len(s.world.snapshot()["creatures"]) == 2
            entry = s.server.ledger.entry("k1")
            assert entry is not None
            assert entry.status is KeyStatus.FAILED
            assert (await s.revert("k1")).status_code == 200
            assert s.world.snapshot()["creatures"] == {}

    run(body)


def test_revert_of_something_missing_is_success(tmp_path: Path) -> None:
    """A key never dispatched, and a resource already gone, revert successfully."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            never = await s.revert("never-seen")
            assert never.status_code == 200
            assert never.json() == {"failures": []}
            serial = (await s.dispatch("k1", kind="orc", region="britain", count=1)).json()["resources"][0]["ref"]
            assert s.world.destroy(serial)  # a player killed it
            gone = await s.revert("k1", resources=[{"kind": "creature", "ref": serial}])
            assert gone.status_code == 200
            assert gone.json() == {"failures": []}

    run(body)


def test_revert_leaves_a_reused_serial_with_a_foreign_tag_alone(tmp_path: Path) -> None:
    """After a revert, the game gives the freed serial to another key's object; reverting
    the first key again (by key alone, from its stored answer) does not remove it."""

    async def body() -> None:
        async with Served(tmp_path) as s:
            serial = (await s.dispatch("k1", kind="orc", region="britain", count=1)).json()["resources"][0]["ref"]
            assert (await s.revert("k1")).status_code == 200
            s.world.reuse_serial(serial, "dragon", "yew", tag="someone-else")
            assert (await s.revert("k1")).status_code == 200
            assert s.world.snapshot()["creatures"] == {serial: {"kind": "dragon", "region": "yew"}}
            assert s.world.tag_of(serial) == "someone-else"

    run(body)


def test_inspect_says_whether_each_resource_exists_and_is_ours(tmp_path: Path) -> None:
    async def body() -> None:
        async with Served(tmp_path) as s:
            a, b, c = (
                r["ref"] for r in (await s.dispatch("k1", kind="orc", region="britain", count=3)).json()["resources"]
            )
            s.world.destroy(b)
            s.world.reuse_serial(c, "dragon", "yew", tag="other")
            resources = [{"kind": "creature", "ref": ref} for ref in (a, b, c)]
            body = {"action": "spawn", "run_id": 1, "idempotency_key": "k1", "resources": resources}
            response = await s.post(protocol.INSPECT, body)
            assert response.status_code == 200
            found = [(r["ref"], r["exists"], r["ours"]) for r in response.json()["resources"]]
            assert found == [(a, True, True), (b, False, False), (c, True, False)]

    run(body)


def test_lease_read_apply_restore(tmp_path: Path) -> None:
    """A targeted lease is read, applied and restored; an untargeted one too; an unknown
    lease is 404; a targeted lease with no target is 422; a bad value is 422."""

    async def body() -> None:
        async with Served(tmp_path) as s:

            def lease(name: str, target: str | None = None, value: object = None) -> dict[str, object]:
                # A key names one borrow: each lease is borrowed under a key of its own.
                key = f"lk-{name}"
                return {
                    "lease": name,
                    "target": target,
                    "run_id": 1,
                    "idempotency_key": key,
                    "value": value,
                    "fence": 1,
                }

            read = await s.post(protocol.LEASE_READ, lease("weather", "britain"))
            assert read.status_code == 200
            assert read.json() == {"value": "clear"}
            assert (await s.post(protocol.LEASE_APPLY, lease("weather", "britain", "storm"))).status_code == 200
            assert s.world.read_weather("britain") == "storm"
            assert (await s.post(protocol.LEASE_RESTORE, lease("weather", "britain", "clear"))).status_code == 200
            assert s.world.read_weather("britain") == "clear"

            assert (await s.post(protocol.LEASE_APPLY, lease("xp_rate", None, 2.5))).status_code == 200
            assert (await s.post(protocol.LEASE_READ, lease("xp_rate"))).json() == {"value": 2.5}

            unknown = await s.post(protocol.LEASE_READ, lease("gravity"))
            assert unknown.status_code == 404
            assert unknown.json()["error"]["field"] == "lease"
            untargeted = await s.post(protocol.LEASE_READ, lease("weather"))
            assert untargeted.status_code == 422
            assert untargeted.json()["error"]["field"] == "target"
            bad = await s.post(protocol.LEASE_APPLY, {**lease("xp_rate", None, "fast"), "idempotency_key": "lk-bad"})
            assert bad.status_code == 422

    run(body)


def test_fail_first_answers_503_before_acting(tmp_path: Path) -> None:
    async def body() -> None:
        async with Served(tmp_path, faults=Faults(fail_first=2)) as s:
            for _ in range(2):
                failed = await s.dispatch("k1")
                assert failed.status_code == 503
                assert failed.json()["error"]["retryable"] is True
            assert s.world.effects() == []
            assert (await s.dispatch("k1")).status_code == 200
            assert len(s.creations()) == 2

    run(body)


def test_lost_answer_is_carried_out_and_stored_then_replayed(tmp_path: Path) -> None:
    """With lose_answers=1 the dispatch is carried out and stored but the response breaks;
    the retry (here against a second server on the same files) gets the stored answer."""

    async def body() -> None:
        async with Served(tmp_path, faults=Faults(lose_answers=1.0, seed=1)) as lossy:
            with pytest.raises(AnswerDropped):
                await lossy.dispatch("k1")
            assert len(lossy.creations("k1")) == 2
            entry = lossy.server.ledger.entry("k1")
            assert entry is not None
            assert entry.status is KeyStatus.DONE
            async with Served(tmp_path) as healthy:
                retried = await healthy.dispatch("k1")
                assert retried.status_code == 200
                assert retried.json() == entry.answer
                assert len(healthy.creations("k1")) == 2

    run(body)


def test_retryable_permanent_and_unexpected_failures(tmp_path: Path) -> None:
    """RetryableError is 503 with Retry-After; PermanentError 422; anything else 500
    (retryable). Each leaves the key re-tryable, and a later success is stored."""

    async def body() -> None:
        async with Served(tmp_path, probe) as s:
            retry = await s.dispatch("k", "act", mode="retry")
            assert retry.status_code == 503
            assert retry.headers["retry-after"] == "3"
            permanent = await s.dispatch("k", "act", mode="permanent")
            assert permanent.status_code == 422
            assert permanent.json()["error"]["message"] == "probe refuses"
            boom = await s.dispatch("k", "act", mode="boom")
            assert boom.status_code == 500
            assert boom.json()["error"] == {"message": "ValueError: probe exploded", "retryable": True}
            ok = await s.dispatch("k", "act", mode="ok")
            assert ok.status_code == 200
            assert (await s.dispatch("k", "act", mode="boom")).json() == ok.json()
            state: ProbeState = s.server.state
            assert [attempt for _key, attempt in state.calls] == [1, 1, 1, 1]
            entry = s.server.ledger.entry("k")
            assert entry is not None
            assert entry.attempts == 4

            # Revert by key alone hands the module the stored answer's resources.
            assert (await s.revert("k", "act")).status_code == 200
            assert state.reverts == [("k", ["t-k"])]

    run(body)


def test_a_key_running_in_another_live_process_is_409(tmp_path: Path) -> None:
    """Two servers on one ledger file (two owners, both alive): while one is inside the
    action, the other answers 409 (retryable) for the same key, then the stored answer."""

    async def body() -> None:
        async with Served(tmp_path, probe) as a, Served(tmp_path, probe) as b:
            state: ProbeState = a.server.state
            state.gate, state.entered = asyncio.Event(), asyncio.Event()
            first = asyncio.create_task(a.dispatch("k", "act", mode="block"))
            await state.entered.wait()
            busy = await b.dispatch("k", "act", mode="block")
            assert busy.status_code == 409
            assert busy.json()["error"]["retryable"] is True
            busy_revert = await b.revert("k", "act")
            assert busy_revert.status_code == 409
            state.gate.set()
            assert (await first).status_code == 200
            replay = await b.dispatch("k", "act", mode="block")
            assert replay.status_code == 200
            assert replay.json() == (await first).json()

    run(body)


def test_a_running_row_left_by_a_dead_owner_is_taken_over(tmp_path: Path) -> None:
    """A key claimed by a ledger that is gone (its process crashed mid-call) runs again."""
    path = str(tmp_path / "keys.db")
    with KeyLedger(path) as gone:
        assert gone.begin("k", "spawn").run
    with KeyLedger(path) as ledger:
        begun = ledger.begin("k", "spawn")
        assert begun.run
        entry = ledger.entry("k")
        assert entry is not None
        assert entry.attempts == 2
        assert entry.owner == ledger.owner

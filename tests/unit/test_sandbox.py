"""The sandbox world and its module: exactly-once effects, tag-checked reverts, fault knobs."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from roadie.clock import FakeClock
from roadie.errors import AnswerLost, PermanentError, RetryableError, Superseded
from roadie.modules.sandbox import BuffParams, SandboxWorld, WorldCrashed, module, open_world
from roadie.registry.module import (
    Answer,
    Call,
    LeaseCall,
    ModuleConfig,
    Resource,
    RevertCall,
    maybe_await,
)

# -- helpers: drive the module exactly as the engine would ------------------------------


class Env:
    """A world opened by the module's own setup hook, and ways to call the module."""

    def __init__(self, tmp_path: Path, clock: FakeClock) -> None:
        assert module.setup_fn is not None
        self.clock = clock
        self.base_dir = str(tmp_path)
        self.world: SandboxWorld = module.setup_fn(ModuleConfig({"db": "world.db"}, clock, self.base_dir))

    def dispatch(self, action: str, key: str, *, fence: int = 0, **params: Any) -> Answer:
        act = module.actions[action]
        call = Call(
            run_id=1,
            step_id=1,
            idempotency_key=key,
            attempt=1,
            params=act.params.model_validate(params),
            state=self.world,
            clock=self.clock,
            fence=fence,
        )
        answer = asyncio.run(act.call(call))
        assert isinstance(answer, Answer)
        return answer

    def revert(self, action: str, key: str, resources: list[Resource], *, fence: int = 0) -> Any:
        revert_fn = module.actions[action].revert_fn
        assert revert_fn is not None
        call = RevertCall(
            run_id=1, idempotency_key=key, resources=resources, state=self.world, clock=self.clock, fence=fence
        )
        return asyncio.run(maybe_await(revert_fn(call)))

    def read(self, lease: str, target: str | None = None) -> Any:
        call = LeaseCall(f"sandbox.{lease}", target, self.world, self.clock)
        return asyncio.run(maybe_await(module.leases[lease].read_fn(call)))

    def write(self, lease: str, value: Any, target: str | None = None, *, fence: int = 0) -> None:
        write_fn = module.leases[lease].write_fn
        assert write_fn is not None
        call = LeaseCall(f"sandbox.{lease}", target, self.world, self.clock, fence=fence)
        asyncio.run(maybe_await(write_fn(call, value)))


def resources(answer: Answer) -> list[Resource]:
    return [Resource(r["kind"], r["ref"], r["payload"]) for r in answer.resources]


def creates(world: SandboxWorld, key: str) -> list[tuple[str, int | None]]:
    return [(e["ref"], e["idx"]) for e in world.effects() if e["key"] == key and e["op"] == "create"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def env(tmp_path: Path, clock: FakeClock) -> Iterator[Env]:
    env = Env(tmp_path, clock)
    yield env
    assert module.close_fn is not None
    module.close_fn(env.world)


# -- the module's shape -------------------------------------------------------------------


def test_module_declares_its_actions_and_leases() -> None:
    """The module passes the registry's check, with the classes DESIGN §3 gives each action."""
    module.check()
    classes = {name: action.reversible.value for name, action in module.actions.items()}
    assert classes == {"spawn": "ledger", "place_item": "ledger", "broadcast": "none", "buff": "self"}
    assert module.leases["weather"].targeted
    assert not module.leases["xp_rate"].targeted


def test_params_refuse_unknown_fields_and_bad_counts() -> None:
    """Parameter schemas forbid extra fields, bound count to 1..500 and parse durations."""
    params = module.actions["spawn"].params
    with pytest.raises(ValidationError):
        params.model_validate({"kind": "orc", "region": "yew", "colour": "red"})
    with pytest.raises(ValidationError):
        params.model_validate({"kind": "orc", "region": "yew", "count": 501})
    with pytest.raises(ValidationError):
        params.model_validate({"kind": "orc", "region": "yew", "count": 0})
    assert module.actions["buff"].params is BuffParams
    assert BuffParams.model_validate({"name": "haste", "region": "yew"}).duration == 60.0
    assert BuffParams.model_validate({"name": "haste", "region": "yew", "duration": "10m"}).duration == 600.0


def test_setup_opens_the_file_relative_to_base_dir(env: Env, tmp_path: Path) -> None:
    """`db` is resolved against the configuration's directory."""
    assert env.world.path == str(tmp_path / "world.db")
    assert (tmp_path / "world.db").exists()


# -- seeding and persistence --------------------------------------------------------------


def test_a_new_file_is_seeded_once(tmp_path: Path, clock: FakeClock) -> None:
    """A new world has five clear regions and xp_rate 1.0; reopening never re-seeds it."""
    path = str(tmp_path / "w.db")
    with open_world(path, clock) as world:
        snap = world.snapshot()
        assert snap["regions"] == dict.fromkeys(["britain", "minoc", "moonglow", "trinsic", "yew"], "clear")
        assert snap["settings"] == {"xp_rate": 1.0, "motd": ""}
        assert snap["creatures"] == snap["items"] == {}
        assert snap["buffs"] == []
        world.set_weather("yew", "fog")
        world.set_setting("xp_rate", 3.0)
    with open_world(path, clock) as again:
        assert again.read_weather("yew") == "fog"
        assert again.read_setting("xp_rate") == 3.0


def test_a_fresh_object_after_an_abandoned_one_sees_the_same_state(tmp_path: Path, clock: FakeClock) -> None:
    """A world object abandoned mid-call (a crash) leaves the file consistent: a fresh
    object sees what was committed, including the armed knobs, and carries on."""
    path = str(tmp_path / "w.db")
    first = SandboxWorld(path, clock)
    first.spawn("k1", "orc", "britain", 3)
    first.crash_next(1)
    first.lose_next(1, action="place_item")
    with pytest.raises(WorldCrashed):
        first.spawn("k2", "troll", "yew", 4)
    before = first.snapshot()
    # `first` is left as it is, never closed until the end: the process "died".
    second = SandboxWorld(path, clock)
    try:
        assert second.snapshot() == before
        assert second.key_ledger().keys() == {"k1"}
        assert second.pending_faults() == [{"kind": "lose", "action": "place_item", "remaining": 1, "message": None}]
        assert len(second.spawn("k2", "troll", "yew", 4)) == 4
        assert len(second.snapshot()["creatures"]) == 7
        new_serial = second.spawn("k3", "orc", "minoc")[0]
        assert new_serial not in before["creatures"]  # the counter lives in the file
    finally:
        second.close()
        first.close()


# -- exactly once -------------------------------------------------------------------------


def test_spawn_is_exactly_once_on_redispatch(env: Env) -> None:
    """Dispatching a key again returns the stored answer and makes nothing new."""
    first = env.dispatch("spawn", "key-1", kind="orc", region="britain", count=3)
    again = env.dispatch("spawn", "key-1", kind="orc", region="britain", count=3)
    assert again == first
    serials = first.output["serials"]
    assert len(set(serials)) == 3
    assert first.resources[0] == {
        "kind": "creature",
        "ref": serials[0],
        "payload": {"kind": "orc", "region": "britain"},
    }
    assert creates(env.world, "key-1") == [(s, i) for i, s in enumerate(serials)]
    assert env.world.key_ledger()["key-1"]["answer"] == serials
    assert set(env.world.snapshot()["creatures"]) == set(serials)


def test_place_item_is_exactly_once_on_redispatch(env: Env) -> None:
    """Items follow the same rule as creatures, and answer resources of kind "item"."""
    first = env.dispatch("place_item", "key-i", kind="chest", region="yew", count=2)
    assert env.dispatch("place_item", "key-i", kind="chest", region="yew", count=2) == first
    assert {r["kind"] for r in first.resources} == {"item"}
    assert env.world.snapshot()["items"] == {s: {"kind": "chest", "region": "yew"} for s in first.output["serials"]}


def test_broadcast_and_buff_are_exactly_once(env: Env) -> None:
    """A re-dispatched broadcast is not said twice; a re-dispatched buff is not stacked."""
    one = env.dispatch("broadcast", "say", message="Dragons!", region="britain")
    assert env.dispatch("broadcast", "say", message="Dragons!", region="britain") == one
    assert [b["message"] for b in env.world.broadcasts()] == ["Dragons!"]
    env.dispatch("buff", "b", name="haste", region="yew", duration="5m")
    env.dispatch("buff", "b", name="haste", region="yew", duration="5m")
    assert len(env.world.snapshot()["buffs"]) == 1


def test_a_half_run_key_makes_only_the_missing_objects(env: Env) -> None:
    """After a crash mid-call, re-dispatching the key makes only the idx not yet made, and
    answers every serial of the call; each (key, idx) is created exactly once."""
    env.world.crash_next(1)
    with pytest.raises(WorldCrashed):
        env.dispatch("spawn", "half", kind="orc", region="trinsic", count=5)
    made = [ref for ref, _ in creates(env.world, "half")]
    assert len(made) == 2  # floor(5 / 2)
    assert "half" not in env.world.key_ledger()

    answer = env.dispatch("spawn", "half", kind="orc", region="trinsic", count=5)
    serials = answer.output["serials"]
    assert serials[:2] == made
    assert len(set(serials)) == 5
    assert Counter(idx for _, idx in creates(env.world, "half")) == Counter(range(5))


def test_a_half_run_object_killed_meanwhile_is_not_made_again(env: Env) -> None:
    """An object the crashed attempt made, then removed by the world, was made once: the
    retry answers its serial and does not make it a second time."""
    env.world.crash_next(1)
    with pytest.raises(WorldCrashed):
        env.world.spawn("k", "orc", "yew", 4)
    killed = creates(env.world, "k")[0][0]
    assert env.world.destroy(killed)
    serials = env.world.spawn("k", "orc", "yew", 4)
    assert serials[0] == killed
    assert len(creates(env.world, "k")) == 4
    assert killed not in env.world.snapshot()["creatures"]


# -- reverts ------------------------------------------------------------------------------


def test_revert_with_resources_restores_the_snapshot(env: Env) -> None:
    """Spawn and place, then revert with the reported resources: the world is as before."""
    before = env.world.snapshot()
    spawned = env.dispatch("spawn", "s", kind="orc", region="britain", count=4)
    placed = env.dispatch("place_item", "p", kind="chest", region="britain", count=2)
    assert env.world.snapshot() != before
    assert env.revert("place_item", "p", resources(placed)) is None
    assert env.revert("spawn", "s", resources(spawned)) is None
    assert env.world.snapshot() == before
    removes = [e for e in env.world.effects() if e["op"] == "remove"]
    assert len(removes) == 6


def test_revert_by_key_alone_removes_what_the_key_made_and_nothing_else(env: Env) -> None:
    """With no resources (the answer was lost), revert removes every creature and item the
    key made — and nothing made by another key or by the world."""
    env.world.lose_next(1)
    with pytest.raises(AnswerLost):
        env.dispatch("spawn", "lost", kind="orc", region="britain", count=3)
    other = env.dispatch("spawn", "other", kind="orc", region="britain", count=2)
    env.world.reuse_serial("0x00000042", "horse", "britain", tag=None)
    assert len(env.world.snapshot()["creatures"]) == 6

    assert env.revert("spawn", "lost", []) is None
    left = env.world.snapshot()["creatures"]
    assert set(left) == {*other.output["serials"], "0x00000042"}


def test_revert_by_key_after_a_crash_removes_the_half(env: Env) -> None:
    """A key that crashed half-way and was never answered is reverted by its tag."""
    before = env.world.snapshot()
    env.world.crash_next(1, action="sandbox.place_item")
    with pytest.raises(WorldCrashed):
        env.dispatch("place_item", "c", kind="chest", region="minoc", count=6)
    assert len(env.world.snapshot()["items"]) == 3
    env.revert("place_item", "c", [])
    assert env.world.snapshot() == before


def test_a_foreign_object_under_a_reused_serial_is_left_alone(env: Env) -> None:
    """The world lost our creature and gave its serial to another object: reverting our
    resource is a success and leaves the foreign object in place."""
    answer = env.dispatch("spawn", "mine", kind="orc", region="yew")
    serial = answer.output["serials"][0]
    env.world.reuse_serial(serial, "horse", "yew", tag="someone-else")
    assert env.revert("spawn", "mine", resources(answer)) is None
    assert env.world.snapshot()["creatures"] == {serial: {"kind": "horse", "region": "yew"}}
    assert env.world.tag_of(serial) == "someone-else"
    assert not env.world.remove_creature(serial, "mine")
    assert env.world.snapshot()["creatures"] == {serial: {"kind": "horse", "region": "yew"}}


def test_removing_a_missing_object_is_a_success(env: Env) -> None:
    """Something already gone (killed by a player) reverts without error or failure."""
    answer = env.dispatch("spawn", "k", kind="orc", region="yew", count=2)
    env.world.destroy(answer.output["serials"][0])
    assert env.revert("spawn", "k", resources(answer)) is None
    assert env.world.snapshot()["creatures"] == {}
    assert env.world.remove_creature("0x7FFFFFFF", "k") is False
    assert env.world.remove_item("0x7FFFFFFF", "k") is False


def test_a_resource_the_sandbox_never_makes_is_a_revert_failure(env: Env) -> None:
    """A revert naming an unknown kind reports it as a failure and still reverts the rest."""
    answer = env.dispatch("spawn", "k", kind="orc", region="yew")
    failures = env.revert("spawn", "k", [*resources(answer), Resource("dragon", "0x1")])
    assert [(f.kind, f.ref) for f in failures] == [("dragon", "0x1")]
    assert env.world.snapshot()["creatures"] == {}


# -- leases -------------------------------------------------------------------------------


def test_weather_lease_reads_and_writes_a_region(env: Env) -> None:
    """The targeted weather lease reads and writes one region's weather."""
    assert env.read("weather", "britain") == "clear"
    env.write("weather", "storm", "britain")
    assert env.read("weather", "britain") == "storm"
    assert env.world.snapshot()["regions"]["yew"] == "clear"


def test_weather_lease_refuses_an_unknown_region(env: Env) -> None:
    """An unknown region (or none) is a permanent error, for reads and for writes."""
    with pytest.raises(PermanentError):
        env.read("weather", "atlantis")
    with pytest.raises(PermanentError):
        env.write("weather", "rain", "atlantis")
    with pytest.raises(PermanentError):
        env.read("weather", None)


def test_xp_rate_lease_reads_and_writes_a_float(env: Env) -> None:
    """The untargeted xp_rate lease reads and writes the setting as a float."""
    assert env.read("xp_rate") == 1.0
    env.write("xp_rate", 2)
    assert env.read("xp_rate") == 2.0
    assert isinstance(env.read("xp_rate"), float)
    with pytest.raises(PermanentError):
        env.write("xp_rate", True)
    with pytest.raises(PermanentError):
        env.write("xp_rate", "fast")


# -- fences -------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["spawn", "place_item", "broadcast", "buff"])
def test_a_dispatch_under_a_lower_fence_is_superseded_and_does_nothing(env: Env, action: str) -> None:
    """Each action, dispatched under fence 5, refuses a copy under fence 4 with Superseded
    (its stored answer is not replayed) and does nothing more; an equal fence (a retry)
    gets the stored answer; a higher one too, and it raises the mark."""
    params = {
        "spawn": {"kind": "orc", "region": "yew", "count": 2},
        "place_item": {"kind": "chest", "region": "yew"},
        "broadcast": {"message": "hello"},
        "buff": {"name": "haste", "region": "yew", "duration": 60},
    }[action]
    first = env.dispatch(action, "k", fence=5, **params)
    effects = env.world.effects()
    with pytest.raises(Superseded):
        env.dispatch(action, "k", fence=4, **params)
    assert env.world.effects() == effects
    assert env.dispatch(action, "k", fence=5, **params) == first
    assert env.dispatch(action, "k", fence=6, **params) == first
    assert env.world.fences() == {("key", "k"): 6}
    with pytest.raises(Superseded):
        env.dispatch(action, "k", fence=5, **params)
    assert env.world.effects() == effects


def test_fence_0_is_never_refused_and_raises_no_mark(env: Env) -> None:
    """A call no claim stands behind (fence 0: a test, a conformance check in process)."""
    answer = env.dispatch("spawn", "k", fence=3, kind="orc", region="yew")
    assert env.dispatch("spawn", "k", kind="orc", region="yew") == answer
    env.write("weather", "storm", "yew")
    assert env.world.fences() == {("key", "k"): 3}


def test_a_revert_under_a_lower_fence_removes_nothing(env: Env) -> None:
    """A revert, with resources or by key alone, under a fence below the key's mark is
    refused and removes nothing; the cleanup holding a newer fence reverts it."""
    answer = env.dispatch("spawn", "k", fence=8, kind="orc", region="yew", count=2)
    before = env.world.snapshot()
    with pytest.raises(Superseded):
        env.revert("spawn", "k", resources(answer), fence=7)
    with pytest.raises(Superseded):
        env.revert("spawn", "k", [], fence=7)
    with pytest.raises(Superseded):
        env.revert("spawn", "k", [Resource("dragon", "0x1")], fence=7)
    assert env.world.snapshot() == before
    assert env.revert("spawn", "k", resources(answer), fence=9) is None
    assert env.world.snapshot()["creatures"] == {}
    with pytest.raises(Superseded):
        env.world.remove_creature(resources(answer)[0].ref, "k", fence=8)


def test_a_lease_write_under_a_lower_fence_leaves_the_value(env: Env) -> None:
    """Lease writes are fenced per target (a region's weather, a setting): a borrow's apply
    or a restore under a fence below the target's mark writes nothing."""
    env.write("weather", "storm", "britain", fence=3)
    with pytest.raises(Superseded):
        env.write("weather", "clear", "britain", fence=2)
    assert env.read("weather", "britain") == "storm"
    env.write("weather", "fog", "yew", fence=1)  # another target
    env.write("weather", "clear", "britain", fence=3)  # the same owner's restore
    env.write("xp_rate", 2.0, fence=10)
    with pytest.raises(Superseded):
        env.write("xp_rate", 1.0, fence=9)
    with pytest.raises(Superseded):
        env.world.set_setting("xp_rate", 1.0, fence=4)
    assert (env.read("weather", "britain"), env.read("weather", "yew"), env.read("xp_rate")) == ("clear", "fog", 2.0)
    assert env.world.fences() == {
        ("lease", "weather#britain"): 3,
        ("lease", "weather#yew"): 1,
        ("lease", "xp_rate"): 10,
    }


def test_a_superseded_call_consumes_no_knob(env: Env) -> None:
    """A refused call is not the call a knob was aimed at."""
    env.dispatch("spawn", "k", fence=5, kind="orc", region="yew")
    env.world.lose_next(1)
    with pytest.raises(Superseded):
        env.dispatch("spawn", "k", fence=4, kind="orc", region="yew")
    assert [f["kind"] for f in env.world.pending_faults()] == ["lose"]


def test_a_world_file_of_schema_1_gets_the_marks_table(tmp_path: Path, clock: FakeClock) -> None:
    """A file made before fences (schema 1, no marks table) is opened as it is, with its
    world, and takes fences from then on; it says schema 2 after."""
    path = tmp_path / "v1.db"
    with open_world(str(path), clock) as world:
        world.spawn("k-old", "orc", "yew", 1)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE fences")
        db.execute("UPDATE meta SET value = '1' WHERE name = 'schema'")
    with open_world(str(path), clock) as world:
        assert len(world.snapshot()["creatures"]) == 1
        world.spawn("k-old", "orc", "yew", 1, fence=2)
        with pytest.raises(Superseded):
            world.spawn("k-old", "orc", "yew", 1, fence=1)
        assert len(world.snapshot()["creatures"]) == 1
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() == ("2",)


# -- fault knobs --------------------------------------------------------------------------


def test_fail_next_raises_before_touching_the_world(env: Env) -> None:
    """fail_next(n) fails the next n calls retryably with nothing changed; then they pass."""
    before = env.world.snapshot()
    env.world.fail_next(2, message="server busy")
    for _ in range(2):
        with pytest.raises(RetryableError, match="server busy"):
            env.dispatch("spawn", "k", kind="orc", region="yew")
    assert env.world.snapshot() == before
    assert env.world.effects() == []
    assert env.world.key_ledger() == {}
    env.dispatch("spawn", "k", kind="orc", region="yew")
    assert len(env.world.snapshot()["creatures"]) == 1


def test_a_knob_for_one_action_leaves_the_others_alone(env: Env) -> None:
    """A knob armed for `spawn` is not met by other actions, nor by lease calls."""
    env.world.fail_next(1, action="sandbox.spawn")
    env.dispatch("broadcast", "b", message="hi")
    env.dispatch("place_item", "p", kind="chest", region="yew")
    assert env.read("weather", "yew") == "clear"
    with pytest.raises(RetryableError):
        env.dispatch("spawn", "s", kind="orc", region="yew")
    env.dispatch("spawn", "s", kind="orc", region="yew")


def test_lease_calls_only_meet_knobs_that_name_them(env: Env) -> None:
    """An unnamed knob is for actions; a knob naming `weather.write` fails the write."""
    env.world.fail_next(1)
    env.world.fail_next(1, action="weather.write")
    with pytest.raises(RetryableError):
        env.write("weather", "rain", "yew")
    assert env.read("weather", "yew") == "clear"
    env.write("weather", "rain", "yew")
    assert env.read("weather", "yew") == "rain"
    assert [f["action"] for f in env.world.pending_faults()] == [None]


def test_lose_next_applies_then_loses_the_answer(env: Env) -> None:
    """lose_next applies the effect and stores the answer, then raises AnswerLost; the retry
    under the same key gets the stored answer and changes nothing."""
    env.world.lose_next(1)
    with pytest.raises(AnswerLost):
        env.dispatch("spawn", "k", kind="orc", region="yew", count=2)
    stored = env.world.key_ledger()["k"]["answer"]
    assert len(env.world.snapshot()["creatures"]) == 2
    answer = env.dispatch("spawn", "k", kind="orc", region="yew", count=2)
    assert answer.output["serials"] == stored
    assert len(creates(env.world, "k")) == 2


def test_crash_next_applies_half_and_stores_no_answer(env: Env) -> None:
    """crash_next makes floor(count/2) objects (none for count 1) and raises a RuntimeError."""
    env.world.crash_next(2)
    with pytest.raises(RuntimeError):
        env.dispatch("spawn", "one", kind="orc", region="yew", count=1)
    assert env.world.snapshot()["creatures"] == {}
    with pytest.raises(WorldCrashed):
        env.dispatch("spawn", "seven", kind="orc", region="yew", count=7)
    assert len(env.world.snapshot()["creatures"]) == 3
    assert env.world.key_ledger() == {}


def test_delay_waits_on_the_clock(tmp_path: Path) -> None:
    """delay(s) makes every call sleep s seconds of the world's clock first, and no more."""
    clock = FakeClock()
    env = Env(tmp_path, clock)

    async def dispatch_while_time_passes(key: str) -> None:
        act = module.actions["spawn"]
        call = Call(
            run_id=1,
            step_id=1,
            idempotency_key=key,
            attempt=1,
            params=act.params.model_validate({"kind": "orc", "region": "yew"}),
            state=env.world,
            clock=clock,
        )
        task = asyncio.create_task(act.call(call))
        await asyncio.sleep(0)
        assert not task.done()
        deadline = clock.next_deadline()
        assert deadline is not None
        clock.set(deadline)
        await task

    try:
        env.world.delay(30)
        start = clock.now()
        asyncio.run(dispatch_while_time_passes("k"))
        assert (clock.now() - start).total_seconds() == 30
        assert len(env.world.snapshot()["creatures"]) == 1
        env.world.delay(0)
        start = clock.now()
        env.dispatch("spawn", "k2", kind="orc", region="yew")
        assert clock.now() == start
    finally:
        env.world.close()


def test_fail_reverts_next_fails_the_revert_then_lets_it_through(env: Env) -> None:
    """fail_reverts_next(n) fails n revert calls retryably with nothing removed."""
    answer = env.dispatch("spawn", "k", kind="orc", region="yew", count=2)
    env.world.fail_reverts_next(2)
    with pytest.raises(RetryableError):
        env.revert("spawn", "k", resources(answer))
    with pytest.raises(RetryableError):
        env.revert("spawn", "k", [])
    assert len(env.world.snapshot()["creatures"]) == 2
    env.revert("spawn", "k", resources(answer))
    assert env.world.snapshot()["creatures"] == {}


def test_lose_reverts_next_answers_the_revert_and_keeps_nothing(env: Env) -> None:
    """lose_reverts_next(n): the revert answers as if done, and the world still holds
    everything (a crash before its next save); the next revert goes through. Named after
    a lease, it loses that lease's next write instead, and leaves reverts alone."""
    answer = env.dispatch("spawn", "k", kind="orc", region="yew", count=2)
    env.world.lose_reverts_next(1)
    assert env.revert("spawn", "k", resources(answer)) is None
    assert len(env.world.snapshot()["creatures"]) == 2
    assert [e["op"] for e in env.world.effects()] == ["create", "create"]
    assert env.world.faults_met["lose_revert"] == 1
    env.world.lose_reverts_next(1, action="weather.write")
    env.revert("spawn", "k", resources(answer))
    assert env.world.snapshot()["creatures"] == {}
    env.write("weather", "storm", "yew")
    assert env.read("weather", "yew") == "clear"
    env.write("weather", "storm", "yew")
    assert env.read("weather", "yew") == "storm"


def test_a_world_file_from_before_lose_revert_takes_the_knob(tmp_path: Path, clock: FakeClock) -> None:
    """A world file whose faults table predates `lose_revert` gets the table made again."""
    path = tmp_path / "old.db"
    open_world(str(path), clock).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE faults")
        db.execute(
            "CREATE TABLE faults (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL CHECK (kind IN "
            "('fail', 'lose', 'crash', 'fail_revert')), action TEXT, remaining INTEGER NOT NULL CHECK "
            "(remaining > 0), message TEXT)"
        )
    with open_world(str(path), clock) as world:
        world.lose_reverts_next(1)
        assert [f["kind"] for f in world.pending_faults()] == ["lose_revert"]


def test_a_refused_call_does_not_consume_a_knob(env: Env) -> None:
    """A call refused as invalid (unknown region) is not the call a lose knob was aimed at."""
    env.world.lose_next(1)
    with pytest.raises(PermanentError):
        env.dispatch("spawn", "k", kind="orc", region="atlantis")
    assert env.world.pending_faults()[0]["kind"] == "lose"


def test_random_faults_are_reproducible_from_the_seed(tmp_path: Path, clock: FakeClock) -> None:
    """Two worlds with the same seed meet the same faults, and exactly-once still holds."""

    def outcomes(name: str) -> tuple[list[str], int]:
        with open_world(str(tmp_path / name), clock) as world:
            world.set_random_faults(fail=0.2, lose=0.2, crash=0.2, seed=7)
            seen: list[str] = []
            for n in range(40):
                key = f"k{n}"
                for _attempt in range(50):
                    try:
                        world.spawn(key, "orc", "yew", 3)
                    except AnswerLost:
                        seen.append("lose")
                    except RetryableError:
                        seen.append("fail")
                    except WorldCrashed:
                        seen.append("crash")
                    else:
                        seen.append("ok")
                        break
            made = Counter((e["key"], e["idx"]) for e in world.effects() if e["op"] == "create")
            assert set(made.values()) == {1}
            return seen, len(world.snapshot()["creatures"])

    first, count = outcomes("a.db")
    assert outcomes("b.db") == (first, count)
    assert count == 120
    assert {"fail", "lose", "crash", "ok"} <= set(first)


def test_a_duplicate_delivery_changes_the_world_once(env: Env) -> None:
    """A call delivered twice (the random `duplicate` fault) is answered twice by the key
    ledger and makes its objects once; every fault met is counted by kind."""
    env.world.set_random_faults(duplicate=1.0, seed=3)
    first = env.dispatch("spawn", "k", kind="orc", region="yew", count=2)
    env.world.set_random_faults()
    assert env.dispatch("spawn", "k", kind="orc", region="yew", count=2) == first
    assert len(env.world.snapshot()["creatures"]) == 2
    assert [e["op"] for e in env.world.effects()] == ["create", "create"]
    env.world.lose_next(1)
    with pytest.raises(AnswerLost):
        env.dispatch("spawn", "k2", kind="orc", region="yew")
    assert env.world.faults_met == Counter({"duplicate": 1, "lose": 1})


def test_the_hook_is_called_on_either_side_of_each_operation(env: Env) -> None:
    """`hook` sees (op, "before") before an operation's transaction and (op, "after") once
    it has committed; a hook that raises before stops the operation from happening."""
    seen: list[tuple[str, str]] = []
    env.world.hook = lambda op, when: seen.append((op, when))
    env.dispatch("spawn", "k", kind="orc", region="yew")
    assert seen == [("spawn", "before"), ("spawn", "after")]

    def refuse(op: str, when: str) -> None:
        raise RuntimeError("killed")

    env.world.hook = refuse
    with pytest.raises(RuntimeError):
        env.dispatch("spawn", "k2", kind="orc", region="yew")
    env.world.hook = None
    assert len(env.world.snapshot()["creatures"]) == 1


def test_clear_faults_disarms_everything(env: Env) -> None:
    """clear_faults drops counted knobs, the delay and random faults."""
    env.world.fail_next(3)
    env.world.delay(5)
    env.world.set_random_faults(fail=1.0, seed=1)
    env.world.clear_faults()
    assert env.world.pending_faults() == []
    assert env.world.current_delay() == 0
    env.dispatch("spawn", "k", kind="orc", region="yew")


# -- snapshots and time -------------------------------------------------------------------


def test_buffs_leave_the_snapshot_when_they_expire(env: Env, clock: FakeClock) -> None:
    """A buff is in the snapshot until the clock passes its expiry, then gone by itself."""
    before = env.world.snapshot()
    answer = env.dispatch("buff", "b", name="haste", region="yew", duration="1m")
    assert env.world.snapshot()["buffs"] == [
        {"name": "haste", "region": "yew", "expires_at": answer.output["expires_at"]}
    ]
    clock.advance(59)
    assert len(env.world.snapshot()["buffs"]) == 1
    clock.advance(1)
    assert env.world.snapshot() == before


def test_snapshot_leaves_out_the_logs(env: Env) -> None:
    """Broadcasts, the key ledger and effects are logs, not world state."""
    before = env.world.snapshot()
    env.dispatch("broadcast", "b", message="Welcome")
    assert env.world.snapshot() == before
    assert env.world.key_ledger().keys() == {"b"}
    assert [e["kind"] for e in env.world.effects()] == ["broadcast"]

"""The sandbox module: Roadie's embedded world as actions and leases (DESIGN §7).

Settings (its table in `roadie.toml`): `db`, the world file, relative to the
configuration's directory (default `sandbox.db`).

| id | class | what it does |
| --- | --- | --- |
| `sandbox.spawn` | ledger | make `count` creatures; reverted by serial and tag |
| `sandbox.place_item` | ledger | place `count` items; reverted by serial and tag |
| `sandbox.broadcast` | none | say a message, to a region or everyone |
| `sandbox.buff` | self | a buff on a region that expires by the clock |
| lease `sandbox.weather#<region>` | targeted | a region's weather |
| lease `sandbox.xp_rate` | untargeted | the world's xp rate, a float |
| lease `sandbox.motd` | untargeted, stacks | the message of the day: each run's banner a layer |

Every call first waits the world's `delay` knob, then passes its fault knobs (see
`SandboxWorld`), so the reliability tests can make any of them misbehave. Every call that
changes the world passes on its `fence`; the world refuses one lower than it has accepted
for the step's key or the lease target, with `Superseded` (docs/protocol.md §4, rule 7).
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from roadie.durations import Duration
from roadie.errors import PermanentError
from roadie.modules.sandbox.world import SandboxWorld, WorldCrashed, open_world
from roadie.registry.module import (
    Answer,
    Call,
    InspectCall,
    Inspected,
    LeaseCall,
    Module,
    ModuleConfig,
    RevertCall,
    RevertFailure,
    Tagged,
    TaggedCall,
    TaggedPage,
)
from roadie.states import Reversible

__all__ = [
    "BroadcastParams",
    "BuffParams",
    "PlaceParams",
    "SandboxWorld",
    "SpawnParams",
    "WorldCrashed",
    "module",
    "open_world",
]

module = Module("sandbox", "The embedded sandbox world: creatures, items, regions, settings")


class SpawnParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=64, description="what to spawn, e.g. orc")
    region: str = Field(min_length=1, description="where, e.g. britain")
    count: int = Field(1, ge=1, le=500, description="how many")


class PlaceParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=64, description="what to place, e.g. chest")
    region: str = Field(min_length=1, description="where, e.g. britain")
    count: int = Field(1, ge=1, le=500, description="how many")


class BroadcastParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1)
    region: str | None = Field(None, description="only this region; everyone when unset")


class BuffParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    region: str = Field(min_length=1)
    duration: Duration = Field(60.0, description="how long the buff lasts, e.g. 10m")


def _world(state: Any) -> SandboxWorld:
    if not isinstance(state, SandboxWorld):
        raise PermanentError("the sandbox module was not set up (no world is open)")
    return state


@module.setup
def setup(config: ModuleConfig) -> SandboxWorld:
    """Open the world file named by `db`, relative to the configuration's directory."""
    db = str(config.get("db", "sandbox.db"))
    path = db if db == ":memory:" else os.path.join(config.base_dir, db)
    return open_world(path, config.clock)


@module.close
def close(state: Any) -> None:
    if isinstance(state, SandboxWorld):
        state.close()


def _objects(kind_of: str, serials: list[str], kind: str, region: str) -> Answer:
    return Answer(
        resources=[{"kind": kind_of, "ref": serial, "payload": {"kind": kind, "region": region}} for serial in serials],
        output={"serials": serials},
    )


@module.action("spawn", reversible=Reversible.LEDGER, params=SpawnParams)
async def spawn(call: Call[SpawnParams]) -> Answer:
    """Spawn creatures in a region; each is tagged with the step's key."""
    world = _world(call.state)
    p = call.params
    async with world.dispatching(call.idempotency_key, "spawn"):
        await world.pace()
        serials = world.spawn(call.idempotency_key, p.kind, p.region, p.count, fence=call.fence)
    return _objects("creature", serials, p.kind, p.region)


@module.action("place_item", reversible=Reversible.LEDGER, params=PlaceParams)
async def place_item(call: Call[PlaceParams]) -> Answer:
    """Place items in a region; each is tagged with the step's key."""
    world = _world(call.state)
    p = call.params
    async with world.dispatching(call.idempotency_key, "place_item"):
        await world.pace()
        serials = world.place_item(call.idempotency_key, p.kind, p.region, p.count, fence=call.fence)
    return _objects("item", serials, p.kind, p.region)


async def _revert(call: RevertCall) -> list[RevertFailure] | None:
    """Remove what the step made: the resources given, by serial and tag, or everything the
    key made when none are given. An object already gone, or whose serial now belongs to
    another key's object, counts as reverted."""
    world = _world(call.state)
    await world.pace()
    if not call.resources:
        world.revert_key(call.idempotency_key, fence=call.fence)
        return None
    failures: list[RevertFailure] = []
    refs: list[tuple[str, str]] = []
    for resource in call.resources:
        if resource.kind in ("creature", "item"):
            refs.append((resource.kind, resource.ref))
        else:
            failures.append(RevertFailure(resource.kind, resource.ref, f"sandbox does not make a {resource.kind!r}"))
    # Called with no refs too: a stale revert is refused whatever it names.
    world.remove_many(call.idempotency_key, refs, fence=call.fence)
    return failures or None


spawn.revert(_revert)
place_item.revert(_revert)


@module.inspect
async def inspect_objects(call: InspectCall) -> list[Inspected]:
    """Whether each creature or item still exists, and still carries the step's tag (a
    serial reused after a crash belongs to someone else's object)."""
    world = _world(call.state)
    await world.pace()
    found = world.inspect([(r.kind, r.ref) for r in call.resources])
    return [
        Inspected(r.kind, r.ref, exists=exists, ours=exists and tag == call.idempotency_key)
        for r, (exists, tag) in zip(call.resources, found, strict=True)
    ]


@module.tagged
async def tagged_objects(call: TaggedCall) -> TaggedPage:
    """Every creature and item carrying a key's tag, a page at a time in serial order:
    what the run's steps made, and what those made by themselves (summons, respawns)."""
    world = _world(call.state)
    await world.pace()
    page, after = world.tagged(call.after, call.limit)
    objects = [
        Tagged(kind_of, serial, tag, {"kind": kind, "region": region}) for kind_of, serial, tag, kind, region in page
    ]
    return TaggedPage(objects, after)


@module.action("broadcast", reversible=Reversible.NONE, params=BroadcastParams)
async def broadcast(call: Call[BroadcastParams]) -> Answer:
    """Say a message to a region, or to everyone."""
    world = _world(call.state)
    async with world.dispatching(call.idempotency_key, "broadcast"):
        await world.pace()
        broadcast_id = world.broadcast(call.idempotency_key, call.params.message, call.params.region, fence=call.fence)
    return Answer(output={"id": broadcast_id})


@module.action("buff", reversible=Reversible.SELF, params=BuffParams)
async def buff(call: Call[BuffParams]) -> Answer:
    """Put a buff on a region; it expires by itself."""
    world = _world(call.state)
    p = call.params
    async with world.dispatching(call.idempotency_key, "buff"):
        await world.pace()
        answer = world.buff(call.idempotency_key, p.name, p.region, p.duration, fence=call.fence)
    return Answer(output=answer)


def _region(call: LeaseCall) -> str:
    if not call.target:
        raise PermanentError("sandbox.weather needs a region as its target")
    return call.target


@module.lease("weather", targeted=True, value=Annotated[str, Field(min_length=1, examples=["storm"])])
async def weather(call: LeaseCall) -> str:
    """A region's weather."""
    world = _world(call.state)
    await world.pace()
    return world.read_weather(_region(call))


@weather.write
async def write_weather(call: LeaseCall, value: Any) -> None:
    world = _world(call.state)
    await world.pace()
    if not isinstance(value, str) or not value:
        raise PermanentError(f"sandbox.weather must be a non-empty string, not {value!r}")
    world.set_weather(_region(call), value, fence=call.fence)


@module.lease("xp_rate", targeted=False, value=Annotated[float, Field(ge=0, examples=[2.0])])
async def xp_rate(call: LeaseCall) -> float:
    """The world's experience rate multiplier."""
    world = _world(call.state)
    await world.pace()
    return float(world.read_setting("xp_rate"))


@module.lease("motd", stacks=True, value=Annotated[str, Field(max_length=500, examples=["Orcs at the gates!"])])
async def motd(call: LeaseCall) -> str:
    """The message of the day players see; events stack their banners on it."""
    world = _world(call.state)
    await world.pace()
    value = world.read_setting("motd", default="")  # a world file older than the setting
    return str(value)


@motd.write
async def write_motd(call: LeaseCall, value: Any) -> None:
    world = _world(call.state)
    await world.pace()
    if not isinstance(value, str) or len(value) > 500:
        raise PermanentError(f"sandbox.motd must be text of at most 500 characters, not {value!r:.80}")
    world.set_setting("motd", value, fence=call.fence)


@xp_rate.write
async def write_xp_rate(call: LeaseCall, value: Any) -> None:
    world = _world(call.state)
    await world.pace()
    # bool is an int to Python, but `xp_rate: true` is an operator's mistake.
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PermanentError(f"sandbox.xp_rate must be a non-negative number, not {value!r}")
    world.set_setting("xp_rate", float(value), fence=call.fence)

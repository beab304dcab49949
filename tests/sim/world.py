"""The simulated world: an in-process module whose every touch of the world passes a gate.

`SimWorld` is what the module changes: tagged objects and two borrowed settings (the
untargeted lease `sim.dial` and the targeted `sim.flag#<target>`). It writes down every
world write and every revert, with the step's key and the run, so the invariants can be
checked against it after every scheduler step. Its actions:

- `sim.make` (ledger): make `count` objects tagged with the key; `late` more appear
  later by themselves; `lost` loses the first attempt's answer after the world was written.
- `sim.override` (ledger): report an `override`-kind resource for `sim.dial`, the target
  `core.lease` borrows. Override rows are core's alone (DESIGN §4 rule 4): the report is
  rejected, and no second live row for the target may ever appear. (A module that also
  wrote the dial itself would change the world behind core's back, which no ledger can
  undo, so this one only reports.)
- leases `sim.dial` and `sim.flag#<target>`: read, write, restore; a restore checks whose
  value it writes over. `sim.banner` stacks: every run may hold a layer of it, and only
  the end (the world back to its start) says whether its layers were given back right.

A summoned (`late`) object is reported afterwards through `record_late_resources`, as
the gateway takes a game server's report.

Like a module server's key ledger (DESIGN §6), a dispatch with a key the world has seen
answers what it answered then and does not touch the world again. Like every module
Roadie ships (docs/protocol.md §4, rule 7), it refuses a call whose fence is older than
one it accepted for the same key or setting, and counts the refusals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from roadie.errors import AnswerLost, Superseded
from roadie.registry import Answer, Call, FenceMarks, LeaseCall, Module, ModuleConfig, RevertCall
from roadie.states import Reversible

Gate = Callable[[str], Awaitable[None]]
INITIAL_SETTINGS = {"sim.dial": "initial", "sim.flag#north": "calm", "sim.flag#south": "calm", "sim.banner": "welcome"}
STACKED = frozenset({"sim.banner"})  # several runs write these at once, each a layer


def step_of(key: str | None) -> str:
    """A key without its run's random nonce (`<nonce>-<run>-<phase>-<seq>` → `<run>-<phase>-<seq>`):
    the nonce changes from one replay to the next, what the trace shows must not."""
    if key is None:
        return "-"
    if key.startswith("restore-"):
        return key
    if key.startswith("keep-"):  # a worker's look at a borrow: `keep-<run>-<row>-<fence>`
        return key.rsplit("-", 1)[0]  # a fence comes from a database sequence, which no replay rewinds
    return key.partition("-")[2] or key


def run_of(key: str) -> int:
    return int(step_of(key).split("-")[0])


@dataclass
class Obj:
    ref: str
    key: str
    run_id: int
    late: bool = False


@dataclass
class Removal:
    actor: str  # the scheduler's actor that reverted it
    at: float  # the clock, in seconds since the start


@dataclass
class Writer:
    how: str  # "borrow" | "restore" | "override"
    run_id: int | None


@dataclass
class SimWorld:
    """Everything the world holds, and everything that happened to it."""

    gate: Gate
    actor: Callable[[], str]  # which scheduler actor is running now
    seconds: Callable[[], float]  # the fake clock, for the record
    objects: dict[str, Obj] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=lambda: dict(INITIAL_SETTINGS))
    made: dict[str, Obj] = field(default_factory=dict)  # every object ever made, by ref
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # the key ledger
    summons: dict[str, int] = field(default_factory=dict)  # key -> late objects still to appear
    attempts: dict[str, set[int]] = field(default_factory=dict)  # key -> attempt numbers that reached the world
    removed: dict[str, Removal] = field(default_factory=dict)
    restored: dict[str, str] = field(default_factory=dict)  # restore key -> the actor that restored first
    writers: dict[str, Writer] = field(default_factory=dict)  # lease target -> who wrote its value last
    log: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (invariant, what) seen by the world itself
    serial: int = 0
    world_writes: int = 0
    fences: FenceMarks = field(default_factory=FenceMarks)
    superseded: int = 0  # calls refused for a stale fence: an owner since replaced

    def fenced(self, target: str, fence: int, what: str, *, lease: bool = False) -> None:
        """Take a call under `fence`, or refuse it as a module must (and say so)."""
        try:
            self.fences.accept(target, fence, lease=lease)
        except Superseded:
            self.superseded += 1
            self.log.append(f"superseded {what} by {self.actor()}")  # fences differ between replays
            raise

    def new_ref(self) -> str:
        self.serial += 1
        return f"obj-{self.serial}"

    def make(self, key: str, count: int, *, late: bool = False) -> list[Obj]:
        made = []
        for _ in range(count):
            obj = Obj(self.new_ref(), key, run_of(key), late)
            self.objects[obj.ref] = obj
            self.made[obj.ref] = obj
            made.append(obj)
            self.world_writes += 1
            self.log.append(f"make {obj.ref} by {step_of(key)}{' (late)' if late else ''}")
        return made

    def remove(self, ref: str, key: str) -> None:
        """A revert of one object. Gone already is a success (DESIGN §5), except that in
        this world nobody but Roadie removes anything: so it was reverted before."""
        obj = self.made.get(ref)
        if obj is None or obj.key != key:
            self.problems.append(("b-revert-once", f"revert of {ref} by {step_of(key)}, which did not make it"))
            return
        if ref not in self.objects:
            self.double_revert(ref)
            return
        del self.objects[ref]
        self.removed[ref] = Removal(self.actor(), self.seconds())
        self.log.append(f"revert {ref} by {self.actor()}")

    def unsummon(self, ref: str) -> None:
        """The game server removes a summon whose report was refused."""
        if self.objects.pop(ref, None) is not None:
            self.log.append(f"unsummon {ref}")

    def double_revert(self, ref: str) -> None:
        """Reported by the simulation, which knows whether the first reverter died (a retry
        after a crash or a lost claim reverts again, harmlessly) or is alive and held it."""
        self.log.append(f"revert {ref} again by {self.actor()}")
        self.problems.append(("b?", f"{ref} {self.actor()}"))

    def write_setting(self, target: str, value: Any, writer: Writer) -> None:
        last = None if target in STACKED else self.writers.get(target)
        if writer.how == "restore":
            if last is not None and last.how != "restore" and last.run_id != writer.run_id:
                self.problems.append(
                    (
                        "d-restore-own-value",
                        f"restore of {target} for run {writer.run_id} wrote {value!r} over run {last.run_id}'s "
                        f"{self.settings[target]!r} ({last.how})",
                    )
                )
        elif last is not None and last.how != "restore" and last.run_id != writer.run_id:
            self.problems.append(
                (
                    "c-one-holder",
                    f"run {writer.run_id} wrote {target} ({writer.how}) while run {last.run_id}'s value was in force",
                )
            )
        self.settings[target] = value
        self.writers[target] = writer
        self.world_writes += 1
        self.log.append(f"{writer.how} {target}={value!r} run {writer.run_id}")


class MakeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = 1
    late: int = 0
    lost: bool = False


class OverrideParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str


def sim_module(world: SimWorld) -> Module:
    """A fresh `sim` module over `world`."""
    sim = Module("sim", "the simulation's world")

    @sim.setup
    def setup(config: ModuleConfig) -> SimWorld:
        return world

    @sim.action("make", reversible=Reversible.LEDGER, params=MakeParams)
    async def make(call: Call[MakeParams]) -> Answer:
        key = call.idempotency_key
        await world.gate(f"dispatch {step_of(key)}#{call.attempt}")
        world.fenced(key, call.fence, f"dispatch {step_of(key)}#{call.attempt}")
        seen = world.attempts.setdefault(key, set())
        if call.attempt in seen:
            world.problems.append(
                ("g-attempt-counted", f"{step_of(key)} reached the world twice as attempt {call.attempt}")
            )
        seen.add(call.attempt)
        if key not in world.answers:
            made = world.make(key, call.params.count)
            world.answers[key] = [{"kind": "obj", "ref": o.ref, "payload": {"step": step_of(key)}} for o in made]
            world.summons[key] = call.params.late
        resources = world.answers[key]
        await world.gate(f"answer {step_of(key)}#{call.attempt}")
        if call.params.lost and call.attempt == 1:
            raise AnswerLost("sim: the answer went missing after the world was written")
        return Answer(resources=list(resources))

    @sim.action("override", reversible=Reversible.LEDGER, params=OverrideParams)
    async def override(call: Call[OverrideParams]) -> Answer:
        key = call.idempotency_key
        await world.gate(f"dispatch {step_of(key)}#{call.attempt}")
        if key not in world.answers:
            saved = world.settings["sim.dial"]
            world.answers[key] = [{"kind": "override", "ref": "sim.dial", "payload": {"saved": saved}}]
        resources = world.answers[key]
        await world.gate(f"answer {step_of(key)}#{call.attempt}")
        return Answer(resources=list(resources))

    async def unmake(call: RevertCall) -> None:
        key = call.idempotency_key
        await world.gate(f"revert {step_of(key)}")
        world.fenced(key, call.fence, f"revert {step_of(key)}")
        if call.resources:
            for r in call.resources:
                world.remove(r.ref, key)
            return
        # By key: whatever this key made and is still there (the answer was never recorded).
        for obj in [o for o in world.objects.values() if o.key == key]:
            world.remove(obj.ref, key)

    make.revert(unmake)
    override.revert(unmake)

    def lease_fns(name: str, targeted: bool, stacks: bool = False) -> None:
        def target_of(call: LeaseCall) -> str:
            return f"sim.{name}#{call.target}" if targeted else f"sim.{name}"

        @sim.lease(name, targeted=targeted, stacks=stacks)
        async def read(call: LeaseCall) -> Any:
            await world.gate(f"read {target_of(call)} {step_of(call.idempotency_key)}")
            return world.settings[target_of(call)]

        @read.write
        async def write(call: LeaseCall, value: Any) -> None:
            await world.gate(f"borrow {target_of(call)} {step_of(call.idempotency_key)}")
            world.fenced(target_of(call), call.fence, f"borrow {target_of(call)}", lease=True)
            world.write_setting(target_of(call), value, Writer("borrow", call.run_id))

        @read.restore
        async def restore(call: LeaseCall, value: Any) -> None:
            await world.gate(f"restore {target_of(call)} {call.idempotency_key}")
            key = str(call.idempotency_key)
            world.fenced(target_of(call), call.fence, f"restore {target_of(call)} {key}", lease=True)
            if key in world.restored:
                world.problems.append(("b?lease", f"{key} {world.actor()}"))
            world.restored.setdefault(key, world.actor())
            world.write_setting(target_of(call), value, Writer("restore", call.run_id))

    lease_fns("dial", False)
    lease_fns("flag", True)
    lease_fns("banner", False, stacks=True)
    return sim

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
one it accepted for the same key or setting, and counts the refusals; `refuse_stale`
off (`--no-fences`) takes every call, to show what the fences hold back. Either way it
checks (i) that no call lands after one under a newer claim for the same key or setting.

What happens to the world from outside Roadie:

- **Calls in transit.** A call the world has been sent is at its gate; when its caller
  is cut off from the database (`in_transit`) and gives up on it (its claim ran out
  unrenewed, its timeout passed), the call lands all the same, when the scheduler says,
  as a request already on the wire to a game server would.
- **Hand edits.** Staff set a setting by hand (`hand_edit`). Roadie must leave such a
  value alone (DESIGN §12): (j) no restore or layer pop writes over it, no call writes
  over it without having read it, and a borrow that read it took it as the value to give
  back. The one write over a hand value that is not Roadie's fault is one whose read came
  before the edit: the lease protocol has no compare-and-set, so an edit that lands
  between a call's read and its write is lost, and the world then owes the value from
  before the edit. The same holds for what a restart put back.
- **Restarts.** The world saves now and then (`save`, and after every teardown: a
  removal, a restore, a layer popped, and a restore's read), and a restart (`restart`)
  rolls it back to what it saved: objects made since are gone, settings written since
  (borrows, hand edits) are as they were. The key ledger, the fence marks and the record
  of what happened survive, as a module's journal does. A restart never undoes a
  teardown: putting back what a lost teardown brought back after its run's cleanup ended
  needs a module that can be inspected and announces its restarts, which this one is
  not. A restore's read is saved too because what it reads decides the teardown: a hand
  value it reads is left alone, and a restart that took the hand edit away after the
  read would bring back the borrow under a teardown that wrote nothing (seed 6517 of
  10,000).

`expected(target)` is what the world owes at the end: its start, or where a hand edit
stands, the last value set by hand.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from roadie.errors import AnswerLost, Superseded
from roadie.registry import Answer, Call, FenceMarks, LeaseCall, Module, ModuleConfig, RevertCall
from roadie.states import Reversible

Gate = Callable[[str], Awaitable[None]]
T = TypeVar("T")
# Told of a world call whose caller gave up on it at its gate: answers whether it was sent
# all the same (its caller is cut off from the database, not dead) and will land later.
Transit = Callable[[str, Callable[[], Any]], bool]
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
    how: str  # "borrow" | "restore" | "hand" (staff, by hand)
    run_id: int | None


@dataclass(frozen=True)
class Read:
    """What a task last read of a setting, and when (the world's change count then)."""

    value: Any
    at: int


@dataclass
class Saved:
    """What the world last saved: what a restart brings back."""

    objects: dict[str, Obj]
    settings: dict[str, Any]
    writers: dict[str, Writer]
    owed: dict[str, Any]


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
    refuse_stale: bool = True  # off: every call is taken, whatever its fence (`--no-fences`)
    landed: dict[tuple[bool, str], int] = field(default_factory=dict)  # (lease?, target) -> highest fence landed
    in_transit: Transit | None = None
    changes: int = 0  # every change of the world counts one: when a read or a hand edit was
    reads: weakref.WeakKeyDictionary[asyncio.Task[Any], dict[str, Read]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    owed: dict[str, Any] = field(default_factory=dict)  # target -> the value the end owes, where a hand edit stands
    # target -> its changes from outside Roadie (a hand edit, a restart): (`changes` then, what it owed before)
    outside: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    hand_edits: int = 0
    saved: Saved | None = None
    saved_at: int = 0  # `changes` when the world last saved
    lost: set[str] = field(default_factory=set)  # objects a restart took away
    # (target, run id): borrows and layers staff forgot. That run's value, in the world now
    # or landing later, is no longer in force: another run may borrow over it.
    forgotten: set[tuple[str, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.save()

    def fenced(self, target: str, fence: int, what: str, *, lease: bool = False) -> None:
        """Take a call under `fence`, or refuse it as a module must (and say so). Whether
        refused or not, a call that lands after one under a newer fence for the same
        target breaks (i): an owner since replaced acted after its successor."""
        if self.refuse_stale:
            try:
                self.fences.accept(target, fence, lease=lease)
            except Superseded:
                self.superseded += 1
                self.log.append(f"superseded {what} by {self.actor()}")  # fences differ between replays
                raise
        if fence <= 0:
            return
        newest = self.landed.get((lease, target), 0)
        if fence < newest:
            self.problems.append(
                ("i-fence-order", f"{what} by {self.actor()} landed after a call under a newer claim for it")
            )
        self.landed[(lease, target)] = max(newest, fence)

    async def touch(self, label: str, land: Callable[[], T]) -> T:
        """Wait at the gate before a change of the world, then make it. A call whose caller
        gives up on it at the gate lands later all the same if it was sent (`in_transit`)."""
        try:
            await self.gate(label)
        except asyncio.CancelledError:
            if self.in_transit is not None:
                self.in_transit(label, land)
            raise
        return land()

    def read(self, target: str) -> Any:
        """A setting, as a lease read sees it: noted for the task that read it."""
        task = asyncio.current_task()
        if task is not None:
            self.reads.setdefault(task, {})[target] = Read(self.settings[target], self.changes)
        return self.settings[target]

    def read_by_me(self, target: str) -> Read | None:
        task = asyncio.current_task()
        return None if task is None else self.reads.get(task, {}).get(target)

    def expected(self, target: str) -> Any:
        return self.owed.get(target, INITIAL_SETTINGS[target])

    def hand_edit(self, target: str, value: Any) -> None:
        """Staff set a setting by hand, in the world, outside Roadie."""
        self.changes += 1
        self.hand_edits += 1
        self.outside.setdefault(target, []).append((self.changes, self.expected(target)))
        self.owed[target] = value
        self.settings[target] = value
        self.writers[target] = Writer("hand", None)
        self.log.append(f"hand {target}={value!r}")

    def save(self) -> None:
        """The world saves what it shows: a restart comes back to this."""
        self.saved = Saved(dict(self.objects), dict(self.settings), dict(self.writers), dict(self.owed))
        self.saved_at = self.changes

    def restart(self) -> None:
        """The world is killed before saving and comes back as it last saved."""
        assert self.saved is not None
        gone = sorted(set(self.objects) - set(self.saved.objects))
        self.lost.update(gone)
        self.objects = dict(self.saved.objects)
        changed = sorted(t for t, v in self.settings.items() if self.saved.settings[t] != v)
        self.changes += 1
        for target in changed:
            self.outside.setdefault(target, []).append((self.changes, self.expected(target)))
        self.settings = dict(self.saved.settings)
        self.writers = dict(self.saved.writers)
        self.owed = dict(self.saved.owed)
        self.saved_at = self.changes
        self.log.append(f"restart: lost {', '.join(gone) or 'no object'}; {', '.join(changed) or 'no setting'} back")

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
            self.changes += 1
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
            if ref in self.lost and ref not in self.removed:
                self.log.append(f"revert {ref} by {self.actor()}: gone with a restart")
                return
            self.double_revert(ref)
            return
        del self.objects[ref]
        self.removed[ref] = Removal(self.actor(), self.seconds())
        self.changes += 1
        self.log.append(f"revert {ref} by {self.actor()}")
        self.save()  # a teardown is saved at once (see the module's docstring)

    def unsummon(self, ref: str) -> None:
        """The game server removes a summon whose report was refused."""
        if self.objects.pop(ref, None) is not None:
            self.changes += 1
            self.log.append(f"unsummon {ref}")
            self.save()

    def double_revert(self, ref: str) -> None:
        """Reported by the simulation, which knows whether the first reverter died (a retry
        after a crash or a lost claim reverts again, harmlessly) or is alive and held it."""
        self.log.append(f"revert {ref} again by {self.actor()}")
        self.problems.append(("b?", f"{ref} {self.actor()}"))

    def write_setting(self, target: str, value: Any, writer: Writer, read: Read | None) -> None:
        """Write a setting for Roadie. `read` is what the writing task last read of it."""
        hand = self.writers.get(target, Writer("start", None)).how == "hand"
        if hand and writer.how == "restore" and read is not None and read.value == value == self.settings[target]:
            # A restore gives back what it read, the hand value still shown (a borrow took
            # it as the value to give back): it changes nothing, and the value stays the
            # hand's. Written all the same for its fence (a lapsed borrow may be on its way).
            self.world_writes += 1
            self.log.append(f"restore {target}={value!r} run {writer.run_id}: the hand value, as it was")
            self.save()
            return
        since = [owed for at, owed in self.outside.get(target, []) if read is not None and at > read.at]
        if since:
            # Read before a change from outside (a hand edit, a restart) landed, written
            # after: no compare-and-set closes that window. What changed since the read is
            # lost, and the world owes what it owed before the first of those changes.
            self.owed[target] = since[0]
            self.log.append(
                f"{target}={self.settings[target]!r} lost between a read and a write of run {writer.run_id}"
            )
        elif hand:
            self.over_hand(target, value, writer, read)
        last = None if target in STACKED else self.writers.get(target)
        if last is not None and (last.how == "hand" or (target, last.run_id) in self.forgotten):
            last = None  # (j) judged it, or staff let that run's value go
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
        self.changes += 1
        self.log.append(f"{writer.how} {target}={value!r} run {writer.run_id}")
        if writer.how == "restore":
            self.save()

    def over_hand(self, target: str, value: Any, writer: Writer, read: Read | None) -> None:
        """Roadie writes over a value set by hand: (j) says whether it may."""
        shown = self.settings[target]
        if read is None:
            why = "without reading it"
        elif writer.how == "restore":
            why = "after reading it (a restore, or a layer popped, must leave it alone)"
        else:
            return  # a borrow that read it: it keeps it to give back, and the end judges
        self.problems.append(
            (
                "j-hand-left-alone",
                f"run {writer.run_id} wrote {target}={value!r} ({writer.how}) over {shown!r}, set by hand, {why}",
            )
        )


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
        label = f"dispatch {step_of(key)}#{call.attempt}"

        def land() -> list[dict[str, Any]]:
            world.fenced(key, call.fence, label)
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
            return world.answers[key]

        resources = await world.touch(label, land)
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

        def land() -> None:
            world.fenced(key, call.fence, f"revert {step_of(key)}")
            if call.resources:
                for r in call.resources:
                    world.remove(r.ref, key)
                return
            # By key: whatever this key made and is still there (the answer was never recorded).
            for obj in [o for o in world.objects.values() if o.key == key]:
                world.remove(obj.ref, key)

        await world.touch(f"revert {step_of(key)}", land)

    make.revert(unmake)
    override.revert(unmake)

    def lease_fns(name: str, targeted: bool, stacks: bool = False) -> None:
        def target_of(call: LeaseCall) -> str:
            return f"sim.{name}#{call.target}" if targeted else f"sim.{name}"

        @sim.lease(name, targeted=targeted, stacks=stacks)
        async def read(call: LeaseCall) -> Any:
            await world.gate(f"read {target_of(call)} {step_of(call.idempotency_key)}")
            shown = world.read(target_of(call))
            if str(call.idempotency_key).startswith("restore-"):
                world.save()  # a teardown's read is saved at once, as its write is: see the docstring
            return shown

        @read.write
        async def write(call: LeaseCall, value: Any) -> None:
            target = target_of(call)
            seen = world.read_by_me(target)  # taken now: a call that lands in transit read it here

            def land() -> None:
                world.fenced(target, call.fence, f"borrow {target}", lease=True)
                world.write_setting(target, value, Writer("borrow", call.run_id), seen)

            await world.touch(f"borrow {target} {step_of(call.idempotency_key)}", land)

        @read.restore
        async def restore(call: LeaseCall, value: Any) -> None:
            target = target_of(call)
            key = str(call.idempotency_key)
            seen = world.read_by_me(target)

            def land() -> None:
                world.fenced(target, call.fence, f"restore {target} {key}", lease=True)
                if key in world.restored:
                    world.problems.append(("b?lease", f"{key} {world.actor()}"))
                world.restored.setdefault(key, world.actor())
                world.write_setting(target, value, Writer("restore", call.run_id), seen)

            await world.touch(f"restore {target} {key}", land)

    lease_fns("dial", False)
    lease_fns("flag", True)
    lease_fns("banner", False, stacks=True)
    return sim

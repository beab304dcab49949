"""The decorator API for writing a module: `Module`, `@module.action`, `@action.revert`,
`@module.lease`, `@lease.write`.

A module written with these decorators runs in-process, and (through the plugin SDK) the
same object can be served to the engine over the network.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter

from roadie.clock import Clock
from roadie.errors import RegistryError
from roadie.states import Reversible

JSON = Any
P = TypeVar("P", bound=BaseModel)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class NoParams(BaseModel):
    """The parameter schema of an action that takes none."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ModuleConfig:
    """What a module's setup hook is given: its table from `roadie.toml`, and the clock."""

    settings: Mapping[str, Any]
    clock: Clock
    base_dir: str = "."

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


@dataclass(frozen=True)
class Call(Generic[P]):
    """One dispatch of an action. The idempotency key is the step's, the same on every retry.

    `fence` grows with every claim of the step (docs/protocol.md §4, rule 7): a module that
    has acted for the key under a higher one refuses this call with `Superseded`. 0 is a
    call no claim stands behind (a test, a conformance check): nothing is refused for it."""

    run_id: int
    step_id: int
    idempotency_key: str
    attempt: int
    params: P
    state: Any
    clock: Clock
    fence: int = 0


@dataclass(frozen=True)
class Resource:
    """One thing a step made, as the ledger knows it and as `revert` is given it."""

    kind: str
    ref: str
    payload: JSON = None
    member_key: str | None = None


@dataclass(frozen=True)
class RevertCall:
    """Take back down what one step made.

    `resources` empty means "whatever this key produced": the step's answer was never
    recorded, so only the module knows, by its key ledger, what it made.
    """

    run_id: int
    idempotency_key: str
    resources: list[Resource]
    state: Any
    clock: Clock
    fence: int = 0  # as Call's: the fence of the cleanup (or sweep) that reverts


@dataclass(frozen=True)
class RevertFailure:
    kind: str
    ref: str
    message: str


@dataclass
class Answer:
    """What an action answers: the resources it made (for `ledger` actions) and any output."""

    resources: list[Any] = field(default_factory=list)
    output: JSON = None


@dataclass(frozen=True)
class LeaseCall:
    """A read or write of a borrowed value. `target` is set for targeted leases.

    `idempotency_key` and `run_id` name the step that borrows (or whose borrow is being
    given back); remote modules send them on the wire. The sweeper's restores carry them too.
    `fence` is the writing owner's (Call's), counted per lease target; a read carries none.
    """

    lease: str
    target: str | None
    state: Any
    clock: Clock
    idempotency_key: str | None = None
    run_id: int | None = None
    fence: int = 0


@dataclass(frozen=True)
class Inspected:
    """Whether a resource still exists in the world, and still carries its step's tag."""

    kind: str
    ref: str
    exists: bool
    ours: bool


@dataclass(frozen=True)
class InspectCall:
    """Ask after resources one step made: do they still exist, and are they still ours?"""

    run_id: int
    idempotency_key: str
    resources: list[Resource]
    state: Any
    clock: Clock
    action: str | None = None  # the name (within its module) of the action that made them


@dataclass(frozen=True)
class Tagged:
    """An object the world holds, tagged with the idempotency key of the step that made it
    (or of the step whose object made it: a summons, a respawn)."""

    kind: str
    ref: str
    key: str
    payload: Any = None


@dataclass(frozen=True)
class TaggedCall:
    """Ask for a page of the objects a module holds tagged with Roadie keys: up to `limit`
    of them, from where the page before ended (`after`, None for the first)."""

    after: str | None
    limit: int
    state: Any
    clock: Clock


@dataclass(frozen=True)
class TaggedPage:
    """One page of tagged objects, and where the next begins (None: this was the last)."""

    objects: list[Tagged]
    next: str | None = None


ActionFn = Callable[[Call[Any]], Any]
RevertFn = Callable[[RevertCall], Any]
LeaseReadFn = Callable[[LeaseCall], Any]
LeaseWriteFn = Callable[[LeaseCall, JSON], Any]
InspectFn = Callable[[InspectCall], Any]
TaggedFn = Callable[[TaggedCall], Any]
OnlineFn = Callable[[Any], Any]  # (the module's state) -> None when reachable, else why not


async def maybe_await(value: Any) -> Any:
    """Modules may write their functions sync or async; the engine awaits either."""
    if inspect.isawaitable(value):
        return await value
    return value


class Action:
    """An action a step can call. `ledger` actions must declare a `revert`."""

    def __init__(
        self,
        module: Module,
        name: str,
        fn: ActionFn,
        *,
        reversible: Reversible,
        params: type[BaseModel],
        description: str,
        borrows: bool = False,
    ) -> None:
        self.module = module
        self.name = name
        self.fn = fn
        self.reversible = reversible
        self.params = params
        self.description = description
        self.borrows = borrows
        self.revert_fn: RevertFn | None = None

    @property
    def id(self) -> str:
        return f"{self.module.name}.{self.name}"

    @property
    def owner(self) -> str:
        return self.module.name

    def revert(self, fn: RevertFn) -> RevertFn:
        """Declare how to take back down what this action made."""
        if self.reversible is not Reversible.LEDGER:
            raise RegistryError(f"{self.id}: only a 'ledger' action has a revert")
        self.revert_fn = fn
        return fn

    async def call(self, call: Call[Any]) -> Any:
        return await maybe_await(self.fn(call))

    def __repr__(self) -> str:
        return f"<Action {self.id} reversible={self.reversible.value}>"


class Lease:
    """A world setting that can be borrowed and given back: `read` it, `write` it.

    A lease that `stacks` may be borrowed by several runs at once: each borrow is a layer
    with a priority, the world shows the top one, and the value from before the first
    comes back when the last is given back. Otherwise one run at a time holds it.
    """

    def __init__(
        self,
        module: Module,
        name: str,
        read: LeaseReadFn,
        *,
        targeted: bool,
        description: str,
        stacks: bool = False,
        value_schema: dict[str, Any] | None = None,
    ) -> None:
        self.module = module
        self.name = name
        self.read_fn = read
        self.targeted = targeted
        self.stacks = stacks
        self.description = description
        # A JSON Schema of the values it takes: an event whose borrow gives another is
        # refused when it is validated, and when a run of it starts. None: any value.
        self.value_schema = value_schema
        self.write_fn: LeaseWriteFn | None = None
        self.restore_fn: LeaseWriteFn | None = None

    @property
    def id(self) -> str:
        return f"{self.module.name}.{self.name}"

    def write(self, fn: LeaseWriteFn) -> LeaseWriteFn:
        self.write_fn = fn
        return fn

    def restore(self, fn: LeaseWriteFn) -> LeaseWriteFn:
        """Optional: how to give the saved value back, when that differs from a write."""
        self.restore_fn = fn
        return fn

    def ref(self, target: str | None) -> str:
        return f"{self.id}#{target}" if target is not None else self.id

    def __repr__(self) -> str:
        return f"<Lease {self.id} targeted={self.targeted} stacks={self.stacks}>"


class Module:
    """A named set of actions and leases, with an optional setup hook.

    ```python
    world = Module("world")

    @world.action("spawn", reversible=Reversible.LEDGER, params=SpawnParams)
    async def spawn(call: Call[SpawnParams]) -> Answer: ...

    @spawn.revert
    async def despawn(call: RevertCall) -> None: ...
    ```
    """

    def __init__(self, name: str, description: str = "") -> None:
        if not _NAME.match(name):
            raise RegistryError(f"module name {name!r} must be lowercase letters, digits and _")
        self.name = name
        self.description = description
        self.actions: dict[str, Action] = {}
        self.leases: dict[str, Lease] = {}
        self.setup_fn: Callable[[ModuleConfig], Any] | None = None
        self.close_fn: Callable[[Any], Any] | None = None
        self.inspect_fn: InspectFn | None = None
        self.tagged_fn: TaggedFn | None = None
        self.online_fn: OnlineFn | None = None

    def action(
        self,
        name: str,
        *,
        reversible: Reversible | str,
        params: type[BaseModel] = NoParams,
        description: str = "",
        borrows: bool = False,
    ) -> Callable[[ActionFn], Action]:
        if not _NAME.match(name):
            raise RegistryError(f"action name {name!r} must be lowercase letters, digits and _")
        if name in self.actions:
            raise RegistryError(f"{self.name}.{name} is registered twice")

        def register(fn: ActionFn) -> Action:
            action = Action(
                self,
                name,
                fn,
                reversible=Reversible(reversible),
                params=params,
                description=description or (inspect.getdoc(fn) or "").split("\n")[0],
                borrows=borrows,
            )
            self.actions[name] = action
            return action

        return register

    def lease(
        self,
        name: str,
        *,
        targeted: bool = False,
        stacks: bool = False,
        description: str = "",
        value: Any = None,
    ) -> Callable[[LeaseReadFn], Lease]:
        """Register a lease by its read function; add its writer with `@lease.write`.
        `stacks=True` lets several runs borrow it at once, each a layer with a priority.
        `value` is the type of the values it takes (`float`, `Literal["day", "night"]`,
        `Annotated[float, Field(ge=0)]`), or a JSON Schema of them: a borrow giving another
        is refused when its event is validated, not when it runs."""
        if not _NAME.match(name):
            raise RegistryError(f"lease name {name!r} must be lowercase letters, digits and _")
        if value is None or isinstance(value, dict):
            schema: dict[str, Any] | None = value
        else:
            try:
                schema = TypeAdapter(value).json_schema()
            except Exception as exc:
                raise RegistryError(f"lease {self.name}.{name}: its value type has no JSON Schema: {exc}") from exc

        def register(fn: LeaseReadFn) -> Lease:
            lease = Lease(
                self,
                name,
                fn,
                targeted=targeted,
                stacks=stacks,
                description=description or (inspect.getdoc(fn) or "").split("\n")[0],
                value_schema=schema,
            )
            self.leases[name] = lease
            return lease

        return register

    def setup(self, fn: Callable[[ModuleConfig], Any]) -> Callable[[ModuleConfig], Any]:
        """Declare the hook that opens the module's state (its world, a client...)."""
        self.setup_fn = fn
        return fn

    def close(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        self.close_fn = fn
        return fn

    def inspect(self, fn: InspectFn) -> InspectFn:
        """Declare how to tell whether resources still exist and still carry their step's
        tag, one `Inspected` (or mapping with `exists` and `ours`) per resource, in order.
        Every cleanup uses it to read back what it reverted and give its verdict."""
        self.inspect_fn = fn
        return fn

    def tagged(self, fn: TaggedFn) -> TaggedFn:
        """Declare how to list what the world holds tagged with Roadie keys, a `TaggedPage`
        at a time. The orphan sweep (`roadie sweep`) uses it to find objects no ledger row
        names (summons, respawns, what an answer that never arrived made) and take down
        those whose run has ended."""
        self.tagged_fn = fn
        return fn

    def online(self, fn: OnlineFn) -> OnlineFn:
        """Declare how to tell whether the world behind the module can be reached now:
        `fn(state)` (sync or async) answers None when it can, or a sentence saying why not
        (`"the game server at 10.0.0.5:7300 does not answer"`). Starting a run asks every
        module the run would call (pre-flight), and refuses the start while one is
        offline, before any step is sent. A module that declares none is taken as online."""
        self.online_fn = fn
        return fn

    def check(self) -> None:
        """Refuse a module whose declarations cannot be honoured."""
        for action in self.actions.values():
            if action.reversible is Reversible.LEDGER and action.revert_fn is None:
                raise RegistryError(f"{action.id} is a 'ledger' action without a revert")
        for lease in self.leases.values():
            if lease.write_fn is None:
                raise RegistryError(f"lease {lease.id} has no writer")

    def __repr__(self) -> str:
        return f"<Module {self.name} actions={sorted(self.actions)} leases={sorted(self.leases)}>"

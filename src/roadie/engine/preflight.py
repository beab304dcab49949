"""Pre-flight: what a run would meet in the world before it starts — the settings it would
borrow and which runs hold each now, and whether the modules it would call are online.

The start form's preview shows it; starting a run checks it too (`runs.start_runs`), so
that a run bound to fail is refused before its first step is sent rather than after a
broadcast that cannot be taken back. It is a look, not a claim: the ledger's reservation
at dispatch (a unique live target) still refuses a borrow another run took meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from roadie.definitions import FrozenDefinition
from roadie.engine.leases import lease_ref, stack_ref
from roadie.errors import PreflightRefused
from roadie.registry import Registry
from roadie.states import LAYER_KIND
from roadie.store import Store

# How long a start waits for a module to say whether it is online: a game server that does
# not answer within it is as good as offline for a run about to call it.
ONLINE_WAIT = 5.0


@dataclass(frozen=True)
class Holder:
    """A run that holds a lease's target now."""

    run_id: int
    started_by: str
    until: datetime | None  # the borrow's `for:` runs out then; None: until its cleanup
    layer: bool  # held as a layer of a lease that stacks

    def describe(self) -> str:
        until = f"until {self.until:%Y-%m-%d %H:%M:%S} UTC" if self.until is not None else "until its cleanup"
        return f"run {self.run_id} (started by {self.started_by}) {until}"


@dataclass(frozen=True)
class Borrow:
    """A setting a run would borrow, and who holds it now."""

    step: str
    ref: str
    value: Any
    priority: Any
    stacks: bool
    holders: tuple[Holder, ...] = ()

    @property
    def held_by(self) -> list[int]:
        return sorted({h.run_id for h in self.holders})

    @property
    def refused(self) -> bool:
        """Whether the ledger would refuse this borrow now: another run holds the target
        outright (a layer over other layers is not refused)."""
        return any(not (self.stacks and h.layer) for h in self.holders)


@dataclass(frozen=True)
class Obstacle:
    """One reason a run would fail if it started now."""

    kind: str  # "lease": another run holds a setting it borrows; "module": a module it calls is offline
    subject: str  # the lease's target, or the module's name
    message: str
    held_by: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "message": self.message, "held_by": self.held_by}


@dataclass
class Preflight:
    """What a run would meet: its borrows, with their holders, and the modules it would
    call that cannot reach their world now."""

    borrows: list[Borrow] = field(default_factory=list)
    offline: dict[str, str] = field(default_factory=dict)  # module -> why it is offline

    @property
    def obstacles(self) -> list[Obstacle]:
        """What would refuse the run, each once: a module it would call that is offline, a
        borrow of a target another run holds outright."""
        found: dict[tuple[str, str], Obstacle] = {}
        for module, why in sorted(self.offline.items()):
            found[("module", module)] = Obstacle("module", module, f"module {module} is offline: {why}")
        for borrow in self.borrows:
            if not borrow.refused:
                continue
            for holder in borrow.holders:
                if borrow.stacks and holder.layer:
                    continue
                message = f"{borrow.ref} is held by {holder.describe()}"
                found.setdefault(("lease", borrow.ref), Obstacle("lease", borrow.ref, message, holder.run_id))
        return list(found.values())


async def check(store: Store, registry: Registry, frozen: Sequence[FrozenDefinition]) -> list[Preflight]:
    """Look at what a run of each of these rendered definitions would meet in the world
    now: one `Preflight` each, in order, from one read of the leases in force."""
    in_force = await store.leases_in_force()
    started_by: dict[int, str] = {}
    if in_force:
        runs = await store.runs_by_ids(sorted({r.run_id for r in in_force}), definition=False)
        started_by = {r.id: r.created_by for r in runs}
    held: dict[str, list[Holder]] = {}
    for row in in_force:
        holder = Holder(row.run_id, started_by.get(row.run_id, "?"), row.until, row.kind == LAYER_KIND)
        held.setdefault(stack_ref(row), []).append(holder)
    found = [_of(registry, definition, held) for definition in frozen]
    modules = [_modules(registry, definition) for definition in frozen]
    asked = sorted(set().union(*modules)) if modules else []
    answers = await asyncio.gather(*(_offline(registry, name) for name in asked))
    offline = {name: why for name, why in zip(asked, answers, strict=True) if why is not None}
    for of_run, names in zip(found, modules, strict=True):
        of_run.offline = {name: offline[name] for name in names if name in offline}
    return found


def refusal(found: Iterable[Preflight]) -> PreflightRefused | None:
    """The error that refuses starting these runs, naming each obstacle once, or None when
    nothing stands in their way."""
    messages = list(dict.fromkeys(o.message for f in found for o in f.obstacles))
    return PreflightRefused(messages) if messages else None


def _of(registry: Registry, definition: FrozenDefinition, held: dict[str, list[Holder]]) -> Preflight:
    found = Preflight()
    for phase in definition.phases:
        for step in phase.steps:
            if not registry.action(step.action).borrows:
                continue
            ref = lease_ref(registry, step.params)
            found.borrows.append(
                Borrow(
                    step=step.name,
                    ref=ref,
                    value=step.params.get("value"),
                    priority=step.params.get("priority"),
                    stacks=registry.lease(str(step.params["lease"])).stacks,
                    holders=tuple(held.get(ref, ())),
                )
            )
    return found


def _modules(registry: Registry, definition: FrozenDefinition) -> set[str]:
    """The modules a run of `definition` would call: its actions' and its borrowed leases'."""
    names = set()
    for phase in definition.phases:
        for step in phase.steps:
            action = registry.action(step.action)
            names.add(action.owner)
            if action.borrows:
                names.add(registry.lease(str(step.params["lease"])).module.name)
    return names


async def _offline(registry: Registry, name: str) -> str | None:
    """Ask one module whether it is online, for at most `ONLINE_WAIT` seconds."""
    try:
        async with asyncio.timeout(ONLINE_WAIT):
            return await registry.offline(name)
    except TimeoutError:
        return f"it did not say whether it can reach its world within {ONLINE_WAIT:g} s"

"""Run creation: an event's definition rendered with its params, checked, and frozen into
a new run.

Operators start runs through `Engine.start_run`; schedules start them here directly, so
that the schedules need not know the engine (the engine runs the schedules each tick).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from roadie.clock import Clock
from roadie.definitions import EventDefinition, FrozenDefinition, render
from roadie.engine import leases
from roadie.errors import DefinitionError, PermanentError, Problem, UnknownLease
from roadie.registry import Registry
from roadie.store import Store
from roadie.store.rows import EventRow, RunRow


async def start_run(
    store: Store,
    registry: Registry,
    clock: Clock,
    event: EventRow,
    params: dict[str, Any] | None = None,
    *,
    actor: str = "cli",
    schedule_key: str | None = None,
) -> RunRow | None:
    """Create a run of `event` with `params`. Every step is rendered and validated now,
    so a run with a bad parameter is refused before anything runs.

    A `schedule_key` names one occurrence of the event's schedule, which makes at most
    one run: None means that occurrence's run exists already."""
    definition = EventDefinition.model_validate(event.definition)
    try:
        resolved = definition.resolve_params(params or {})
    except ValueError as exc:
        raise DefinitionError([Problem(event.event_id, None, "params", str(exc))]) from exc
    frozen = render(definition, resolved, registry)
    check_leases(registry, frozen)
    now = clock.now()
    return await store.create_run(
        event=event,
        definition=frozen.model_dump(mode="json", by_alias=True),
        params=resolved,
        cleanup_policy=definition.cleanup.value,
        first_phase_due=now + timedelta(seconds=frozen.phases[0].after),
        actor=actor,
        now=now,
        schedule_key=schedule_key,
    )


def check_leases(registry: Registry, frozen: FrozenDefinition) -> None:
    """Refuse a run whose borrowing steps name a lease no module registers, all at once."""
    problems = []
    for p_index, phase in enumerate(frozen.phases):
        for step in phase.steps:
            if registry.action(step.action).borrows:
                try:
                    leases.lease_ref(registry, step.params)
                except (UnknownLease, PermanentError) as exc:
                    field = f"phases[{p_index}].steps[{step.seq}].with.lease"
                    problems.append(Problem(frozen.event.id, None, field, str(exc)))
    if problems:
        raise DefinitionError(problems)

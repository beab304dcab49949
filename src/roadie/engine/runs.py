"""Run creation: an event's definition rendered with its params, checked, and frozen into
a new run.

Operators start runs through `Engine.start_run`; schedules start them here directly, so
that the schedules need not know the engine (the engine runs the schedules each tick).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from roadie.clock import Clock
from roadie.definitions import EventDefinition, FrozenDefinition, render
from roadie.engine import preflight
from roadie.errors import DefinitionError, PreflightRefused, Problem
from roadie.registry import Registry
from roadie.store import NewRun, Store
from roadie.store.rows import EventRow, RunRow


async def start_runs(
    store: Store,
    registry: Registry,
    clock: Clock,
    event: EventRow,
    params: Sequence[dict[str, Any] | None],
    *,
    actor: str = "cli",
    schedule_keys: Sequence[str] | None = None,
    in_thread: bool = True,
    definitions: dict[int, FrozenDefinition] | None = None,
    force: bool = False,
) -> list[RunRow | None]:
    """Create a run of `event` for each of `params`, in one transaction. Every step of
    every run is rendered and validated first, so one bad parameter refuses them all
    before anything is stored; runs with the same params are rendered once.

    `schedule_keys`, one per run, name occurrences of the event's schedule, each of which
    makes at most one run: None in the answer means that occurrence's run exists already.
    `definitions` (an engine's, by run id) is given each new run's frozen definition, which
    its advance would otherwise read back and parse again, run by run.

    Then pre-flight (`preflight.check`): a run that would borrow a setting another run
    holds, or call a module that is offline, is refused with `PreflightRefused` before
    anything is stored or sent, unless `force`, which starts it anyway and audits what was
    overridden (`run.force`). A
    schedule's run that pre-flight finds bound to fail is made failed instead, with the
    reason as its error, and ends before any step is sent (audited as `run.refused`):
    its occurrence is spent, and a `run.failed` notification says so."""
    if schedule_keys is not None and len(schedule_keys) != len(params):
        raise ValueError("one schedule key per run")
    definition = EventDefinition.model_validate(event.definition)
    rendered: dict[str, tuple[dict[str, Any], FrozenDefinition]] = {}
    now = clock.now()
    new: list[NewRun] = []
    frozen_of_each: list[FrozenDefinition] = []
    for index, given in enumerate(params):
        try:
            resolved = definition.resolve_params(given or {})
        except ValueError as exc:
            where = "params" if len(params) == 1 else f"runs[{index}].params"
            raise DefinitionError([Problem(event.event_id, None, where, str(exc))]) from exc
        same = json.dumps(resolved, sort_keys=True, default=str)
        if same not in rendered:
            if in_thread:
                # Off the event loop: the loop's other work goes on while an event's
                # templates render (each render is bounded in time and size).
                frozen = await asyncio.to_thread(render, definition, resolved, registry)
            else:
                frozen = render(definition, resolved, registry)
            rendered[same] = (frozen.model_dump(mode="json", by_alias=True), frozen)
        dumped, frozen = rendered[same]
        new.append(
            NewRun(
                event=event,
                definition=dumped,
                params=resolved,
                cleanup_policy=definition.cleanup.value,
                first_phase_due=now + timedelta(seconds=frozen.phases[0].after),
                schedule_key=schedule_keys[index] if schedule_keys is not None else None,
            )
        )
        frozen_of_each.append(frozen)
    new = await _preflight(store, registry, new, frozen_of_each, force=force, scheduled=schedule_keys is not None)
    made = await store.create_runs(new, actor, now)
    if definitions is not None:
        definitions.update((run.id, f) for run, f in zip(made, frozen_of_each, strict=True) if run is not None)
    return made


async def _preflight(
    store: Store,
    registry: Registry,
    new: list[NewRun],
    frozen: list[FrozenDefinition],
    *,
    force: bool,
    scheduled: bool,
) -> list[NewRun]:
    """Refuse the runs when pre-flight finds any bound to fail, or, with `force`, mark what
    each was started over, for its `run.force` audit entry; a schedule's runs so found are
    marked to be made failed."""
    found = await preflight.check(store, registry, frozen)
    refusal = preflight.refusal(found)
    if refusal is None:
        return new
    if scheduled and not force:
        return [
            replace(run, refused=_refused(refused)) if (refused := preflight.refusal([f])) is not None else run
            for run, f in zip(new, found, strict=True)
        ]
    if not force:
        raise refusal
    return [
        replace(run, overridden=[o.as_dict() for o in f.obstacles] or None) for run, f in zip(new, found, strict=True)
    ]


def _refused(refusal: PreflightRefused) -> str:
    return "refused by pre-flight before any step was sent: " + "; ".join(refusal.obstacles)

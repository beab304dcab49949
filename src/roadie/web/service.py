"""What the API and the dashboard both do, on top of the engine and the store the CLI uses.

Each function is one operator action, with the same rules as its CLI command.
"""

from __future__ import annotations

import asyncio
import difflib
import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from roadie.definitions import EventDefinition, ScheduleDef, load_definition, render
from roadie.definitions.catalogue import schema_of
from roadie.engine import preflight, schedules
from roadie.engine.cleanup import CleanupReport, PlannedCall, what_and_where
from roadie.errors import DefinitionError, InvalidState, NotFound, Problem
from roadie.registry import Registry
from roadie.states import CleanupStatus, RunStatus
from roadie.store.rows import EventRow, RunRow
from roadie.web.state import WebState

MAX_EVENT_BYTES = 1 << 20


def event_text(raw: bytes, filename: str) -> str:
    """An uploaded event file's bytes as text; one too large or not UTF-8 is a
    `DefinitionError` naming the file, as a mistake inside it would be."""
    if len(raw) > MAX_EVENT_BYTES:
        raise DefinitionError([Problem(filename, None, "", "the file is larger than 1 MiB")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefinitionError([Problem(filename, None, "", f"not UTF-8 text ({exc.reason})")]) from exc


async def upload_event(state: WebState, text: str, source: str, actor: str, *, base: int | None = None) -> EventRow:
    """Validate an event file's text as `roadie event apply` does and store it as the
    event's newest version. A mistake raises `DefinitionError` naming file:line: field.

    `base` is the version the writer saw the changes against (0: none, a new event):
    when the event has moved on since, nothing is stored (`InvalidState`), so that what
    they confirmed is what is stored over."""
    definition = load_definition(text, source, state.registry)
    if base is not None:
        newest = await _newest(state, definition.id)
        now = newest.version if newest is not None else 0
        if now != base:
            said = f"version {base}" if base else "no version"
            raise InvalidState(
                f"event {definition.id} is at version {now} now, not {said} as when its changes were shown: "
                "someone stored it meanwhile; review the changes again"
            )
    return await state.store.create_event_version(
        definition.id,
        definition.title,
        definition.model_dump(mode="json", by_alias=True),
        text,
        actor,
        state.clock.now(),
    )


@dataclass
class CheckedEvent:
    """What storing a valid event file would do."""

    event_id: str
    phases: int
    steps: int
    version: int  # the version storing it would make, or answer when it defines the same event
    current: int  # the newest stored version; 0 for a new event
    message: str
    changes: list[str]  # a unified diff from the newest stored version; empty for a new event


async def check_event(state: WebState, text: str, source: str) -> CheckedEvent:
    """Validate an event file's text as `upload_event` would, storing nothing; answers what
    storing it would do, and what it changes from the newest stored version. A mistake
    raises `DefinitionError` naming file:line: field."""
    definition = load_definition(text, source, state.registry)
    newest = await _newest(state, definition.id)
    stored = newest.version if newest is not None else 0
    steps = sum(len(phase.steps) for phase in definition.phases)
    phases = len(definition.phases)
    # As the store decides: a file that defines the same event (a comment changed) makes
    # no new version.
    same = newest is not None and newest.definition == definition.model_dump(mode="json", by_alias=True)
    would = (
        f"it defines the same event as version {stored}, so storing it would make no new version"
        if same
        else f"storing it would make version {stored + 1}"
    )
    message = (
        f"{source} is valid: event {definition.id}, {phases} phase{'s' if phases != 1 else ''} and "
        f"{steps} step{'s' if steps != 1 else ''}; {would}. Nothing was stored."
    )
    changes = source_changes(newest.source, text, f"v{stored}", "edited") if newest is not None else []
    return CheckedEvent(definition.id, phases, steps, stored if same else stored + 1, stored, message, changes)


def source_changes(before: str, after: str, before_name: str, after_name: str) -> list[str]:
    """What changed from one event file's text to another's, as a unified diff's lines."""
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), before_name, after_name, lineterm="")
    return list(lines)


async def _newest(state: WebState, event_id: str) -> EventRow | None:
    try:
        return await state.store.get_event(event_id)
    except NotFound:
        return None


async def start_run(
    state: WebState,
    event_id: str,
    params: dict[str, Any],
    actor: str,
    version: int | None = None,
    *,
    force: bool = False,
) -> RunRow:
    """Start a run; one that pre-flight finds bound to fail is refused (`PreflightRefused`,
    409) unless `force`."""
    event = await state.store.get_event(event_id, version)
    return await state.engine.start_run(event, params, actor=actor, force=force)


async def preview_run(state: WebState, event: EventRow, params: dict[str, Any]) -> dict[str, Any]:
    """What a run of `event` with `params` would do, without starting it: its phases and
    steps rendered with the params (refused as a start would be), the leases it would
    borrow and who holds each now, the modules it would call that are offline
    (`preflight.check`, which a start checks too), and how it would be taken down."""
    definition = EventDefinition.model_validate(event.definition)
    frozen = await asyncio.to_thread(render, definition, definition.resolve_params(params), state.registry)
    [found] = await preflight.check(state.store, state.registry, [frozen])
    phases = [
        {
            "name": phase.name,
            "after": phase.after,
            "steps": [(s.name, s.action, step_words(state.registry, s.action, s.params)) for s in phase.steps],
        }
        for phase in frozen.phases
    ]
    borrows = [
        {"ref": b.ref, "value": b.value, "priority": b.priority, "stacks": b.stacks, "held_by": b.held_by}
        for b in found.borrows
    ]
    return {"phases": phases, "borrows": borrows, "offline": found.offline, "cleanup": definition.cleanup.value}


def step_words(registry: Registry, action: str, params: dict[str, Any]) -> str:
    """What a step would make, in the world's words, said from its params as its ledger
    rows will be (`3 golden goose in yew`): a `count` (or the action's default for it)
    of a `kind` somewhere. A step whose params do not say so is its params, as rendered."""
    said = what_and_where(params)
    count = params.get("count")
    if count is None:
        count = schema_of(registry.action(action)).get("properties", {}).get("count", {}).get("default")
    if said and isinstance(count, int) and not isinstance(count, bool):
        return f"{count} {said}"
    given = {name: value for name, value in params.items() if value is not None}  # not the unset optionals
    return ", ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in given.items())


async def start_runs(
    state: WebState,
    event_id: str,
    params: list[dict[str, Any]],
    actor: str,
    version: int | None = None,
    *,
    force: bool = False,
) -> list[RunRow]:
    event = await state.store.get_event(event_id, version)
    return await state.engine.start_runs(event, params, actor=actor, force=force)


async def cancel_run(state: WebState, run_id: int, actor: str) -> None:
    run = await state.store.get_run(run_id)
    if not await state.engine.cancel_run(run_id, actor=actor):
        why = "already being cancelled" if run.cancel_requested else f"{run.status}, not in flight"
        raise InvalidState(f"run {run_id} is {why}")


async def clean_up(
    state: WebState,
    run_id: int,
    actor: str,
    *,
    member_key: str | None = None,
    again: bool = False,
    confirm: bool = False,
) -> CleanupReport:
    """`roadie cleanup`: a run that is `complete`, `incomplete`, found rolled back or was
    never dirty is cleaned up again (its rounds counted anew); a pending one is taken
    unless another worker holds it."""
    run = await state.store.get_run(run_id)
    retry = again or run.cleanup_status != CleanupStatus.PENDING.value
    return await state.engine.clean_up(run_id, actor=actor, member_key=member_key, again=retry, confirm=confirm)


async def plan(state: WebState, run_id: int, member_key: str | None = None) -> list[PlannedCall]:
    return await state.engine.cleanup.plan(run_id, member_key)


async def schedule_views(state: WebState) -> list[dict[str, Any]]:
    now = state.clock.now()
    found = []
    for event, standing in await state.store.scheduled_events():
        raw = (event.definition or {}).get("schedule") or {}
        upcoming: datetime | None = None
        try:
            if raw:
                after = standing.last_occurrence if standing else now
                upcoming = schedules.next_occurrence(ScheduleDef.model_validate(raw), max(after, now))
        except ValidationError:
            upcoming = None
        found.append(
            {
                "event_id": event.event_id,
                "version": event.version,
                "schedule": raw,
                "last_occurrence": standing.last_occurrence if standing else None,
                "next_occurrence": upcoming,
            }
        )
    return found


def plan_dicts(calls: list[PlannedCall]) -> list[dict[str, Any]]:
    return [asdict(c) for c in calls]


IN_FLIGHT = (RunStatus.PENDING.value, RunStatus.RUNNING.value)

"""`roadie event`: validate, apply and list event definitions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from roadie.cli.common import ConfigOption, DatabaseOption, JsonOption, console, group, in_context, in_store, print_json

if TYPE_CHECKING:
    from roadie.runtime import Context

event_app = group("Event definitions: validate, apply, list.")


@event_app.command("validate")
def event_validate(
    file: Path = typer.Argument(..., metavar="FILE", help="An event file, YAML or JSON."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Check an event file against the loaded modules, without storing it (exit 65 with
    every mistake, file:line: field: message)."""
    from roadie.definitions import load_file

    async def work(ctx: Context) -> dict[str, Any]:
        definition = load_file(file, ctx.registry)
        steps = sum(len(p.steps) for p in definition.phases)
        return {"file": str(file), "ok": True, "event": definition.id, "phases": len(definition.phases), "steps": steps}

    checked = in_context(database_url, config, work, as_json=as_json, read_only=True)
    if as_json:
        print_json(checked)
        return
    console.print(f"{file}: ok — event {checked['event']!r}, {checked['phases']} phases, {checked['steps']} steps")


@event_app.command("apply")
def event_apply(
    file: Path = typer.Argument(..., metavar="FILE", help="An event file, YAML or JSON."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Validate an event file and store it as the event's newest version."""

    async def work(ctx: Context) -> dict[str, Any]:
        row = await apply_event(ctx, file)
        return {"event": row.event_id, "version": row.version}

    applied = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json(applied)
        return
    console.print(f"event {applied['event']!r} version {applied['version']}")


async def apply_event(ctx: Context, file: Path) -> Any:
    from roadie.definitions import load_file

    definition = load_file(file, ctx.registry)
    return await ctx.store.create_event_version(
        definition.id,
        definition.title,
        definition.model_dump(mode="json", by_alias=True),
        file.read_text(),
        os.environ.get("USER", "cli"),
        ctx.engine.clock.now(),
    )


@event_app.command("list")
def event_list(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """List events, newest version of each."""

    from roadie.store.events import EventQueries

    async def work(store: EventQueries) -> list[Any]:
        return await store.list_events()

    rows = in_store(database_url, config, EventQueries, work, as_json=as_json)
    if as_json:
        from roadie import views

        print_json(views.shown_all(views.Event, rows))
        return
    table = Table("event", "version", "title", "phases", "schedule")
    for r in rows:
        schedule = r.definition.get("schedule") or {}
        when = schedule.get("cron") or (f"{len(schedule['at'])} times" if schedule.get("at") else "")
        if schedule.get("cron") and schedule.get("timezone", "UTC") != "UTC":
            when += f" ({schedule['timezone']})"
        table.add_row(r.event_id, str(r.version), r.title, str(len(r.definition.get("phases", []))), when)
    console.print(table)

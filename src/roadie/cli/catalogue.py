"""`roadie actions`: what the loaded modules offer an event's author."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from roadie.cli.common import ConfigOption, DatabaseOption, JsonOption, console, in_context, print_json

if TYPE_CHECKING:
    from roadie.definitions.catalogue import ModuleEntry
    from roadie.runtime import Context


def actions(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """The actions and leases of every loaded module: parameters, reversible class, and
    a step that calls each (--json: with their JSON Schemas)."""
    from roadie.definitions.catalogue import catalogue

    async def work(ctx: Context) -> list[ModuleEntry]:
        return catalogue(ctx.registry)

    modules = in_context(database_url, config, work, as_json=as_json, looks=True)
    if as_json:
        print_json([m.as_dict() for m in modules])
        return
    table = Table("action", "reversible", "parameters (* required)", "what it does")
    for module in modules:
        for action in module.actions:
            params = ", ".join(f"{p.name}{'*' if p.required else ''}: {p.type}" for p in action.params)
            table.add_row(action.id, action.reversible, params, action.description)
    console.print(table)
    leases = Table("lease", "borrowed", "takes", "what it is")
    for module in modules:
        for lease in module.leases:
            how = "per target" if lease.targeted else "whole world"
            borrowed = f"{how}, {'in layers' if lease.stacks else 'by one run at a time'}"
            leases.add_row(lease.id, borrowed, lease.takes, lease.description)
    console.print(leases)
    console.print('A step for each: roadie actions --json ("example"), or the dashboard\'s Catalogue page.')

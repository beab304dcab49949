"""`roadie sandbox` (show, serve) and `roadie demo`: the embedded sandbox world."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from roadie.cli.common import ConfigOption, DatabaseOption, JsonOption, console, fail, group, in_context, print_json
from roadie.cli.sandbox_serve import SecretOption, fetch_world
from roadie.cli.sandbox_serve import serve as sandbox_serve
from roadie.errors import RoadieError

if TYPE_CHECKING:
    from roadie.runtime import Context

sandbox_app = group("The embedded sandbox world.")


@sandbox_app.command("show")
def sandbox_show(
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
    url: str | None = typer.Option(
        None, "--url", metavar="URL", help="Read a `roadie sandbox serve` at this URL instead."
    ),
    secret: str | None = SecretOption,
) -> None:
    """The sandbox world's state: regions, settings, creatures, items, active buffs."""

    async def work(ctx: Context) -> dict[str, Any]:
        snapshot: dict[str, Any] = ctx.registry.state("sandbox").snapshot()
        return snapshot

    if url:
        if not secret:
            raise typer.BadParameter("--url needs the server's --secret (or ROADIE_SANDBOX_SECRET)")
        try:
            snapshot = fetch_world(url, secret)
        except RoadieError as exc:
            fail([exc.message], as_json=as_json)
    else:
        snapshot = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json(snapshot)
        return
    from roadie.cli.demo import world_table

    console.print(world_table({"now": snapshot}, title="sandbox world"))


sandbox_app.command("serve")(sandbox_serve)


def demo(
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Run the bundled invasion against the sandbox world with faults on, clean up, and
    compare the world before and after. Exits 0 only if they are equal."""
    from roadie.cli.demo import run_demo

    equal = in_context(database_url, config, lambda ctx: run_demo(ctx, console))
    raise typer.Exit(0 if equal else 1)

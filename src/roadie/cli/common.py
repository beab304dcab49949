"""What the commands share: the consoles, the common options, a context to work in, and
how states and JSON are printed."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import typer
from rich.console import Console

from roadie.errors import DefinitionError, RoadieError
from roadie.runtime import Context, open_context

T = TypeVar("T")

console = Console()
err = Console(stderr=True)

DatabaseOption = typer.Option(None, "--database-url", help="Database URL (env ROADIE_DATABASE_URL; roadie.toml).")
ConfigOption = typer.Option(None, "--config", help="Configuration file (default ./roadie.toml; env ROADIE_CONFIG).")
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")


def in_context(database_url: str | None, config: str | None, work: Callable[[Context], Awaitable[T]], **kw: Any) -> T:
    """Open the context, run `work`, and turn Roadie's errors into a message and exit 1."""

    async def go() -> T:
        async with open_context(database_url, config, **kw) as ctx:
            return await work(ctx)

    try:
        return asyncio.run(go())
    except DefinitionError as exc:
        for problem in exc.problems:
            err.print(f"[red]error[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except RoadieError as exc:
        err.print(f"[red]error[/] {exc.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


STATE_STYLE = {
    "alive": "green",
    "stopped": "dim",
    "dead": "red",
    "succeeded": "green",
    "complete": "green",
    "reverted": "dim",
    "resolved": "dim",
    "running": "cyan",
    "ready": "blue",
    "pending": "yellow",
    "live": "yellow",
    "failed": "red",
    "incomplete": "red",
    "cancelled": "magenta",
    "skipped": "dim",
    "abandoned": "magenta",
    "not_required": "dim",
}


def styled(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{state}[/]" if style else state

"""What the commands share: the consoles, the common options, a context to work in, and
how states, errors and JSON are printed.

This module and the command modules import no more than Typer and Rich when loaded:
`roadie --help`, `--version`, completion and a mistyped option open no database, so a
command imports the runtime (the engine, the store, SQLAlchemy), the web stack and the
remote client inside its function, and only what it uses.

The consoles never read markup: what they print is data (a world's error message, a
param value, an event's title) and `[/]` in it is text. Styling is given as `Text`."""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from roadie.cli.help import Group
from roadie.errors import (
    ConfigError,
    DefinitionError,
    NotFound,
    PreflightRefused,
    RegistryError,
    RoadieError,
    StoreError,
)

if TYPE_CHECKING:
    from roadie.runtime import Context
    from roadie.store.connector import Connector

T = TypeVar("T")
Q = TypeVar("Q", bound="Connector")  # the queries of one concern of the store (`in_store`)

# Piped output is not cut to 80 columns: a table is as wide as its widest row.
PIPED_WIDTH = 10_000


def make_console(*, stderr: bool = False, quiet: bool = False) -> Console:
    console = Console(stderr=stderr, quiet=quiet, markup=False, highlight=False, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH
    return console


console = make_console()
err = make_console(stderr=True)


def group(help: str) -> typer.Typer:
    """A group of commands (`roadie run ...`), with help as Click prints it: flags shown as
    flags, and text printed as written."""
    return typer.Typer(cls=Group, help=help, no_args_is_help=True, rich_markup_mode=None)


def _or_given_before(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """A command's own --database-url or --config; else the one given before the command
    (`roadie --database-url X run list`), which the app's callback keeps in `ctx.obj`."""
    if value is not None:
        return value
    given = ctx.find_root().obj
    return given.get(param.name) if isinstance(given, dict) else None


DatabaseOption = typer.Option(
    None,
    "--database-url",
    metavar="URL",
    callback=_or_given_before,
    help="Database URL (env ROADIE_DATABASE_URL; roadie.toml). Also taken before the command.",
)
ConfigOption = typer.Option(
    None,
    "--config",
    metavar="FILE",
    callback=_or_given_before,
    help="Configuration file (default ./roadie.toml; env ROADIE_CONFIG). Also taken before the command.",
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts, errors included.")

# Exit codes by kind of failure, after BSD's sysexits.h, so a script or a service manager
# can tell a mistake in a file from a database that is down. 1 is a refused or failed
# operation; 2 is Click's own for a bad command line.
EXIT_CODES: tuple[tuple[type[RoadieError], int], ...] = (
    (PreflightRefused, os.EX_TEMPFAIL),  # 75: a setting another run holds, a module offline: later, perhaps not
    (DefinitionError, os.EX_DATAERR),  # 65: an event file or a param is wrong
    (NotFound, os.EX_NOINPUT),  # 66: no such run, event, resource
    (StoreError, os.EX_UNAVAILABLE),  # 69: the database cannot be opened or failed
    (ConfigError, os.EX_CONFIG),  # 78: roadie.toml or a module's settings are wrong
    (RegistryError, os.EX_CONFIG),
)


def exit_code(error: RoadieError) -> int:
    return next((code for kind, code in EXIT_CODES if isinstance(error, kind)), 1)


def fail(messages: list[str], *, code: int = 1, kind: str = "error", as_json: bool = False) -> NoReturn:
    """Report an error and exit: one line per message on stderr, or, under `--json`, one
    JSON object on stdout where the script reading it looks."""
    if as_json:
        print_json({"error": {"kind": kind, "messages": messages, "exit_code": code}})
    else:
        for message in messages:
            err.print(Text.assemble(("error", "red"), " ", message), soft_wrap=True)
    raise typer.Exit(code)


def name_values(given: list[str], flag: str) -> dict[str, str]:
    """`NAME=VALUE` options (`-p count=3 -p region=yew`) as a dict. A name given twice is
    a usage error naming it, not the last value silently kept: a list is one JSON value
    (`-p waves='[3, 5]'`), so two values for one name are a mistake, not a list."""
    found: dict[str, str] = {}
    for pair in given:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise typer.BadParameter(f"{pair!r}: write {flag} NAME=VALUE", param_hint=flag)
        if name in found:
            raise typer.BadParameter(
                f"{name!r} given twice ({name}={found[name]}, {name}={value}): give it once; "
                f"a list is one JSON value, {name}='[...]'",
                param_hint=flag,
            )
        found[name] = value
    return found


WEB_LIBRARIES = ("fastapi", "starlette", "uvicorn", "prometheus_client", "itsdangerous", "python_multipart")


def require_web(command: str) -> None:
    """Refuse, in one line, a command whose libraries (the `web` extra) are not installed."""
    missing = []
    for name in WEB_LIBRARIES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        fail(
            [f"roadie {command} needs the 'web' extra ({', '.join(missing)} not installed): pip install 'roadie[web]'"],
            code=os.EX_UNAVAILABLE,
            kind="not_installed",
        )


def listening(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` for a server to serve on; one that cannot be bound
    (in use, not this machine's address) is one line and exit 69, not a server's log."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(
            [f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port, or stop what holds it"],
            code=os.EX_UNAVAILABLE,
            kind="listen",
        )
    sock.set_inheritable(True)
    return sock


def in_context(
    database_url: str | None,
    config: str | None,
    work: Callable[[Context], Awaitable[T]],
    *,
    as_json: bool = False,
    **kw: Any,
) -> T:
    """Open the context, run `work`, and turn Roadie's errors into a message and an exit
    code by their kind (`EXIT_CODES`)."""
    from roadie.runtime import open_context

    async def go() -> T:
        async with open_context(database_url, config, **kw) as ctx:
            return await work(ctx)

    return _run(go, as_json=as_json)


def in_store(
    database_url: str | None,
    config: str | None,
    queries: type[Q],
    work: Callable[[Q], Awaitable[T]],
    *,
    as_json: bool = False,
) -> T:
    """As `in_context`, for a command that reads only what is stored: it opens the
    database alone with the `queries` of the concern it reads (`open_store`), and loads
    neither the modules, the engine nor the rest of the store."""
    from roadie.runtime import open_store

    async def go() -> T:
        async with open_store(database_url, config, queries) as store:
            return await work(store)

    return _run(go, as_json=as_json)


def _run(go: Callable[[], Coroutine[Any, Any, T]], *, as_json: bool) -> T:
    import asyncio

    try:
        return asyncio.run(go())
    except DefinitionError as exc:
        fail([str(p) for p in exc.problems], code=exit_code(exc), kind="definition", as_json=as_json)
    except RoadieError as exc:
        fail([exc.message], code=exit_code(exc), kind=_kind(exc), as_json=as_json)


def _kind(error: RoadieError) -> str:
    """The error's class as a word: `StoreError` -> "store", `NotFound` -> "not_found"."""
    name = type(error).__name__.removesuffix("Error")
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name)) or "error"


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


def styled(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def line(*parts: str | Text | tuple[str, str]) -> Text:
    """One line of output from plain text (data, never markup) and styled pieces."""
    return Text.assemble(*parts)


def clip(text: str | None, width: int) -> str:
    """`text` cut to `width` characters, with an ellipsis where it was cut."""
    text = text or ""
    return text if len(text) <= width else text[: width - 1] + "…"

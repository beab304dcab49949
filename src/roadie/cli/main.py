"""`roadie`: the command line. Every command takes `--database-url` and `--config`.

The commands live by group in the modules beside this one; this one builds the app from
them, and says under which heading and in which order `roadie --help` lists them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from roadie.cli.catalogue import actions
from roadie.cli.cleanup import audit, cleanup, forget, leases, sweep
from roadie.cli.conformance import conformance, secret
from roadie.cli.events import event_app
from roadie.cli.help import Command, Group
from roadie.cli.logs import configured_logging
from roadie.cli.runs import run_app
from roadie.cli.sandbox import demo, sandbox_app
from roadie.cli.web import serve, token_app
from roadie.cli.webhooks import webhooks_app
from roadie.cli.workers import gateway, init, worker, workers_list


class Roadie(Group):
    """`roadie --help` lists the commands as an operator meets them: setting up and running
    an event, the services that carry runs out, looking and repairing, access, trying it
    on the sandbox; then a module author's tools. A new command must be placed here
    (tests/unit/test_cli_help.py)."""

    sections = (
        ("Run events", ("init", "event", "run", "cleanup")),
        ("Serve", ("worker", "serve", "gateway")),
        ("Look and repair", ("workers", "leases", "audit", "sweep", "forget")),
        ("Access and notifications", ("token", "webhooks")),
        ("Try it", ("demo", "sandbox")),
        ("Write a module", ("actions", "conformance", "secret")),
    )


app = typer.Typer(
    cls=Roadie,
    name="roadie",
    help="Run live events against a world other software owns, and take back down exactly what they changed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(event_app, name="event")
app.add_typer(run_app, name="run")
app.add_typer(sandbox_app, name="sandbox")
app.command("conformance")(conformance)
app.command("secret")(secret)


def _version(asked: bool) -> None:
    if asked:
        from importlib import metadata  # here: reading the installed packages is a few hundredths of a second

        try:
            version = metadata.version("roadie")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source tree never installed
            version = "unknown (not installed)"
        sys.stdout.write(f"roadie {version}\n")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        metavar="URL",
        help="Database URL for the command that follows, as its own --database-url (which wins) "
        "(env ROADIE_DATABASE_URL; roadie.toml).",
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        metavar="FILE",
        help="Configuration file for the command that follows, as its own --config (which wins) "
        "(default ./roadie.toml; env ROADIE_CONFIG).",
    ),
    log_level: str = typer.Option("warning", "--log-level", metavar="LEVEL", help="debug, info, warning or error."),
    log_json: bool = typer.Option(False, "--log-json", help="Log as JSON lines on stderr."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print Roadie's version and exit."
    ),
) -> None:
    """--database-url and --config given here stand for every command that is not given
    its own (`common.DatabaseOption`)."""
    ctx.obj = {"database_url": database_url, "config": config}
    _logging.update(level=log_level, json=log_json)


# What --log-level and --log-json asked for: the callback above keeps it, and the command
# sets logging up as it starts (`_logged`).
_logging: dict[str, Any] = {"level": "warning", "json": False}


def _logged(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command`, with logging set up as it asked (when it first logs). The callback runs
    for `roadie run --help` too, before the command's options are read, so it only keeps
    what was asked."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        with configured_logging(_logging["level"], json=_logging["json"]):
            return command(*args, **kwargs)

    return run


def _finish(group: typer.Typer) -> None:
    """Every command sets logging up as it starts, and names its values in its help by
    what they are (`help.Command`)."""
    for command in group.registered_commands:
        command.cls = Command
        if command.callback is not None:
            command.callback = _logged(command.callback)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _finish(sub.typer_instance)


app.command()(init)
app.command()(worker)
app.command()(gateway)
app.command("workers")(workers_list)
app.command()(cleanup)
app.command()(forget)
app.command()(sweep)
app.command()(leases)
app.command()(actions)
app.command()(audit)
app.command()(demo)
app.add_typer(token_app, name="token")
app.add_typer(webhooks_app, name="webhooks")
app.command()(serve)
_finish(app)


if __name__ == "__main__":  # pragma: no cover
    app()

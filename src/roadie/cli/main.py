"""`roadie`: the command line. Every command takes `--database-url` and `--config`.

The commands live by group in the modules beside this one; this one builds the app from
them, in the order `roadie --help` lists them.
"""

from __future__ import annotations

import sys
from importlib import metadata

import typer

from roadie.cli.catalogue import actions
from roadie.cli.cleanup import audit, cleanup, forget, leases, sweep
from roadie.cli.conformance import conformance, secret
from roadie.cli.events import event_app
from roadie.cli.logs import configure_logging
from roadie.cli.runs import run_app
from roadie.cli.sandbox import demo, sandbox_app
from roadie.cli.web import serve, token_app
from roadie.cli.webhooks import webhooks_app
from roadie.cli.workers import gateway, init, worker, workers_list

app = typer.Typer(
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
        try:
            version = metadata.version("roadie")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source tree never installed
            version = "unknown (not installed)"
        sys.stdout.write(f"roadie {version}\n")
        raise typer.Exit()


@app.callback()
def main(
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
    log_json: bool = typer.Option(False, "--log-json", help="Log as JSON lines on stderr."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print Roadie's version and exit."
    ),
) -> None:
    configure_logging(log_level, json=log_json)


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


if __name__ == "__main__":  # pragma: no cover
    app()

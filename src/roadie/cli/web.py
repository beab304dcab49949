"""The web: `roadie serve` (the HTTP API and the dashboard) and `roadie token`."""

from __future__ import annotations

import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from roadie.cli.common import (
    ConfigOption,
    DatabaseOption,
    JsonOption,
    console,
    err,
    group,
    in_context,
    in_store,
    listening,
    print_json,
    require_web,
)

if TYPE_CHECKING:
    from roadie.runtime import Context

token_app = group("API tokens of `roadie serve`: create, list, revoke.")


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="Port to listen on."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve only; leave the runs to `roadie worker`s."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", metavar="N", min=1, help="The embedded worker's concurrency."
    ),
    secret_key: str | None = typer.Option(
        None,
        "--secret-key",
        metavar="KEY",
        envvar="ROADIE_SECRET_KEY",
        help="Signs session cookies (env ROADIE_SECRET_KEY). Default: random per process, so sessions end "
        "on restart; give every server behind one address the same key.",
    ),
    secure_cookies: bool = typer.Option(False, "--secure-cookies", help="Mark the session cookie Secure (HTTPS)."),
    max_body: int = typer.Option(
        1 << 20,
        "--max-body",
        metavar="BYTES",
        min=1024,
        help="The largest request body in bytes (default 1 MiB); a larger one is refused with 413 before it "
        "is read. An event file's upload may take 4 MiB, or this if larger.",
    ),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Serve the HTTP API (/api/v1, OpenAPI at /openapi.json), the dashboard, /metrics and
    /healthz, with an embedded worker unless --no-worker. SIGTERM or Ctrl-C stops it
    gracefully: the worker lets in-flight steps answer first."""
    require_web("serve")
    import asyncio

    import uvicorn

    from roadie.remote import gateway
    from roadie.runtime import freeze_heap
    from roadie.web import WebOptions, create_app

    options = WebOptions(database_url=database_url, config=config, worker=not no_worker, concurrency=concurrency)
    if secret_key:
        options.secret_key = secret_key
    options.secure_cookies = secure_cookies
    options.max_body = max_body
    # A database that cannot be opened is one line before anything is served, not a
    # traceback from the server's startup.
    in_context(database_url, config, _opened)
    sock = listening(host, port)
    serving = f"roadie serve on http://{host}:{port} (worker {'off' if no_worker else 'on'})"

    class Server(gateway.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # said once the port is bound and the app has started, not before
                err.print(serving)

    app = create_app(options)
    config_ = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)

    async def stop_worker() -> None:
        web = getattr(app.state, "web", None)
        if web is not None and web.worker_task is not None:
            web.engine.stop()
            await asyncio.wait([web.worker_task])

    freeze_heap()

    def queue() -> Any:
        return getattr(getattr(app.state, "gateway", None), "queue", None)

    Server(config_, queue, stop_worker).run(sockets=[sock])


async def _opened(ctx: Context) -> None:
    """Nothing more: `in_context` has opened (and migrated) the database, loaded the modules."""


@token_app.command("create")
def token_create(
    role: str = typer.Option(..., "--role", help="viewer (read), operator (start, cancel, clean up) or admin."),
    name: str = typer.Option(..., "--name", help="Who or what holds it; the audit log names it."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Mint an API token and print it once; only its hash is stored."""
    from roadie.web import tokens

    try:
        chosen = tokens.Role(role)
    except ValueError:
        raise typer.BadParameter(f"{role!r}: choose viewer, operator or admin", param_hint="--role") from None
    minted = tokens.mint()

    async def work(ctx: Context) -> Any:
        return await ctx.store.create_token(
            key=minted.key,
            name=name,
            role=chosen.value,
            secret_hash=minted.secret_hash,
            actor=os.environ.get("USER", "cli"),
            now=ctx.engine.clock.now(),
        )

    row = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json({"id": row.id, "name": row.name, "role": row.role, "key": row.key, "token": minted.token})
        return
    sys.stdout.write(minted.token + "\n")
    err.print(f"token {row.name!r} ({row.role}) created; it is shown this once")


@token_app.command("list")
def token_list(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Every token, revoked ones too. Secrets are never shown again."""

    from roadie.store.auth import AuthQueries

    async def work(store: AuthQueries) -> list[Any]:
        return await store.list_tokens()

    rows = in_store(database_url, config, AuthQueries, work, as_json=as_json)
    if as_json:
        from roadie import views

        print_json(views.shown_all(views.Token, rows))
        return
    table = Table("id", "name", "role", "key", "created", "by", "revoked")
    for r in rows:
        revoked = r.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if r.revoked_at else ""
        table.add_row(
            str(r.id), r.name, r.role, r.key, r.created_at.strftime("%Y-%m-%d %H:%M:%S"), r.created_by, revoked
        )
    console.print(table if rows else "no tokens")


@token_app.command("revoke")
def token_revoke(
    token: str = typer.Argument(..., metavar="TOKEN", help="The token's name, key or id."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Revoke a token; its dashboard sessions end at once. Audited."""

    async def work(ctx: Context) -> Any:
        return await ctx.store.revoke_token(token, os.environ.get("USER", "cli"), ctx.engine.clock.now())

    row = in_context(database_url, config, work)
    console.print(f"token {row.name!r} revoked")

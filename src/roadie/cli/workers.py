"""The process commands: init, worker, gateway, and the workers list."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from roadie.cli.common import (
    ConfigOption,
    DatabaseOption,
    JsonOption,
    console,
    in_context,
    listening,
    print_json,
    require_web,
    styled,
)

if TYPE_CHECKING:
    from roadie.runtime import Context


def init(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Create or upgrade the database schema (migrations are also applied on every start).
    With --json, the database (its password as ***) and the schema's migration."""
    from roadie.store.dialects import redacted
    from roadie.store.migrate import head

    async def work(ctx: Context) -> str:
        return ctx.settings.database_url

    url = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json({"database_url": redacted(url), "schema": head()})
        return
    console.print(f"database ready: {redacted(url)}")


def worker(
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        metavar="N",
        min=1,
        help="Steps dispatched at once (default: engine.concurrency in roadie.toml, or 32).",
    ),
    claim_ttl: float | None = typer.Option(
        None,
        "--claim-ttl",
        metavar="SECONDS",
        min=1.0,
        help="Seconds a claim lives without a heartbeat; a dead worker's work is taken over after this "
        "(default: engine.claim_ttl in roadie.toml, or 60).",
    ),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Run a worker: claim steps, dispatch them, record answers, clean up.

    SIGTERM or Ctrl-C stops it gracefully: it claims nothing more, lets in-flight steps
    answer (each within its timeout), gives back what it still holds, and exits 0.
    """
    from roadie.runtime import freeze_heap
    from roadie.store.dialects import redacted

    async def work(ctx: Context) -> None:
        import asyncio
        import signal

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, ctx.engine.stop)
        options = ctx.engine.options
        console.print(
            f"worker {ctx.engine.worker_id} on {redacted(ctx.settings.database_url)} "
            f"(concurrency {options.concurrency}, claim ttl {options.claim_ttl:g}s)",
        )
        freeze_heap()
        await ctx.engine.run_forever()
        console.print(f"worker {ctx.engine.worker_id} stopped")

    in_context(database_url, config, work, concurrency=concurrency, claim_ttl=claim_ttl)


def gateway(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(7400, "--port", min=1, max=65535, help="Port to listen on."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve the gateway only; run workers elsewhere."),
    visibility: float = typer.Option(
        30.0,
        "--visibility",
        metavar="SECONDS",
        min=0.1,
        help="Seconds a pulled call stays hidden before it is handed out again.",
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", metavar="N", min=1, help="The embedded worker's concurrency."
    ),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Serve what remote modules call: the pull work queue (announce, pull, answer) and late
    resource reports, each signed with the module's secret (docs/protocol.md).

    An embedded worker runs beside it unless --no-worker; its pulled calls are answered
    the moment a module posts them back. SIGTERM or Ctrl-C stops both gracefully.
    """
    require_web("gateway")
    import asyncio

    import uvicorn

    from roadie.remote import gateway
    from roadie.runtime import freeze_heap
    from roadie.store.dialects import redacted

    sock = listening(host, port)

    async def work(ctx: Context) -> None:
        ctx.remotes.queue.visibility = visibility
        config_ = uvicorn.Config(ctx.gateway().app(), host=host, port=port, log_level="warning")
        worker: list[asyncio.Task[None]] = []

        async def stop_worker() -> None:
            ctx.engine.stop()
            await asyncio.wait(worker)

        server = gateway.Server(config_, lambda: ctx.remotes.queue, None if no_worker else stop_worker)
        # uvicorn stops on SIGINT/SIGTERM and then raises the signal again for the handler
        # it found: let that be one that does nothing, so a graceful stop exits 0.
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        console.print(f"gateway on http://{host}:{port} for {redacted(ctx.settings.database_url)}")
        freeze_heap()
        if no_worker:
            await server.serve(sockets=[sock])
            return
        worker.append(asyncio.create_task(ctx.engine.run_forever()))
        try:
            await server.serve(sockets=[sock])  # returns on SIGINT/SIGTERM, once the worker has stopped
        finally:
            ctx.engine.stop()
            await worker[0]
        console.print("gateway stopped")

    in_context(database_url, config, work, concurrency=concurrency)


def workers_list(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Who is working: each worker alive, stopped or dead (no heartbeat for a claim's
    lifetime), its last heartbeat, and the steps and cleanups claimed in its name."""

    async def work(ctx: Context) -> tuple[datetime, list[Any]]:
        now = ctx.engine.clock.now()
        return now, await ctx.store.list_workers(now, ctx.engine.options.claim_ttl)

    now, rows = in_context(database_url, config, work, as_json=as_json, looks=True)
    if as_json:
        from roadie import views

        print_json(views.shown_all(views.Worker, rows))
        return
    table = Table("worker", "state", "host", "pid", "last heartbeat", "steps", "cleanups", "concurrency", "started")
    for r in rows:
        age = (now - r.heartbeat_at).total_seconds()
        table.add_row(
            r.worker_id,
            styled(r.state),
            r.host,
            str(r.pid),
            f"{age:.1f}s ago",
            str(r.steps),
            str(r.cleanups),
            str(r.concurrency),
            r.started_at.isoformat(timespec="seconds"),
        )
    console.print(table)

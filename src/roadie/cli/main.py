"""`roadie`: the command line. Every command takes `--database-url` and `--config`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from roadie.cli.conformance import conformance
from roadie.cli.logs import configure_logging
from roadie.cli.progress import RunProgress
from roadie.cli.sandbox_serve import SecretOption, fetch_world
from roadie.cli.sandbox_serve import serve as sandbox_serve
from roadie.definitions import load_file
from roadie.errors import DefinitionError, RoadieError
from roadie.runtime import Context, open_context
from roadie.store.rows import RunRow

T = TypeVar("T")

app = typer.Typer(
    name="roadie",
    help="Run live events against a world other software owns, and take back down exactly what they changed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
event_app = typer.Typer(help="Event definitions: validate, apply, list.", no_args_is_help=True)
run_app = typer.Typer(help="Runs: start, list, show, cancel.", no_args_is_help=True)
sandbox_app = typer.Typer(help="The embedded sandbox world.", no_args_is_help=True)
app.add_typer(event_app, name="event")
app.add_typer(run_app, name="run")
app.add_typer(sandbox_app, name="sandbox")
app.command("conformance")(conformance)

console = Console()
err = Console(stderr=True)

DatabaseOption = typer.Option(None, "--database-url", help="Database URL (env ROADIE_DATABASE_URL; roadie.toml).")
ConfigOption = typer.Option(None, "--config", help="Configuration file (default ./roadie.toml; env ROADIE_CONFIG).")
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")


@app.callback()
def main(
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
    log_json: bool = typer.Option(False, "--log-json", help="Log as JSON lines on stderr."),
) -> None:
    configure_logging(log_level, json=log_json)


def _run(database_url: str | None, config: str | None, work: Callable[[Context], Awaitable[T]], **kw: Any) -> T:
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


def _print_json(data: Any) -> None:
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


def _styled(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{state}[/]" if style else state


# -- init / worker ----------------------------------------------------------------------


@app.command()
def init(database_url: str | None = DatabaseOption, config: str | None = ConfigOption) -> None:
    """Create or upgrade the database schema (migrations are also applied on every start)."""

    async def work(ctx: Context) -> str:
        return ctx.settings.database_url

    url = _run(database_url, config, work)
    console.print(f"database ready: {url}")


@app.command()
def worker(
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        help="Steps dispatched at once (default: engine.concurrency in roadie.toml, or 32).",
    ),
    claim_ttl: float | None = typer.Option(
        None,
        "--claim-ttl",
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

    async def work(ctx: Context) -> None:
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, ctx.engine.stop)
        options = ctx.engine.options
        console.print(
            f"worker {ctx.engine.worker_id} on {ctx.settings.database_url} "
            f"(concurrency {options.concurrency}, claim ttl {options.claim_ttl:g}s)",
            highlight=False,
        )
        await ctx.engine.run_forever()
        console.print(f"worker {ctx.engine.worker_id} stopped", highlight=False)

    _run(database_url, config, work, concurrency=concurrency, claim_ttl=claim_ttl)


@app.command()
def gateway(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(7400, "--port", min=1, max=65535, help="Port to listen on."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve the gateway only; run workers elsewhere."),
    visibility: float = typer.Option(
        30.0, "--visibility", min=0.1, help="Seconds a pulled call stays hidden before it is handed out again."
    ),
    concurrency: int | None = typer.Option(None, "--concurrency", min=1, help="The embedded worker's concurrency."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Serve what remote modules call: the pull work queue (announce, pull, answer) and late
    resource reports, each signed with the module's secret (docs/protocol.md).

    An embedded worker runs beside it unless --no-worker; its pulled calls are answered
    the moment a module posts them back. SIGTERM or Ctrl-C stops both gracefully.
    """
    import uvicorn

    async def work(ctx: Context) -> None:
        ctx.remotes.queue.visibility = visibility
        server = uvicorn.Server(uvicorn.Config(ctx.gateway().app(), host=host, port=port, log_level="warning"))
        # uvicorn stops on SIGINT/SIGTERM and then raises the signal again for the handler
        # it found: let that be one that does nothing, so a graceful stop exits 0.
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        console.print(f"gateway on http://{host}:{port} for {ctx.settings.database_url}", highlight=False)
        if no_worker:
            await server.serve()
            return
        worker_task = asyncio.create_task(ctx.engine.run_forever())
        try:
            await server.serve()  # returns on SIGINT/SIGTERM (uvicorn handles them)
        finally:
            ctx.engine.stop()
            await worker_task
        console.print("gateway stopped", highlight=False)

    _run(database_url, config, work, concurrency=concurrency)


@app.command("workers")
def workers_list(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Who is working: each worker alive, stopped or dead (no heartbeat for a claim's
    lifetime), its last heartbeat, and the steps and cleanups claimed in its name."""

    async def work(ctx: Context) -> tuple[datetime, list[Any]]:
        now = ctx.engine.clock.now()
        return now, await ctx.store.list_workers(now, ctx.engine.options.claim_ttl)

    now, rows = _run(database_url, config, work)
    if as_json:
        _print_json([asdict(r) for r in rows])
        return
    table = Table("worker", "state", "host", "pid", "last heartbeat", "steps", "cleanups", "concurrency", "started")
    for r in rows:
        age = (now - r.heartbeat_at).total_seconds()
        table.add_row(
            r.worker_id,
            _styled(r.state),
            r.host,
            str(r.pid),
            f"{age:.1f}s ago",
            str(r.steps),
            str(r.cleanups),
            str(r.concurrency),
            r.started_at.isoformat(timespec="seconds"),
        )
    console.print(table)


# -- events -----------------------------------------------------------------------------


@event_app.command("validate")
def event_validate(
    file: Path = typer.Argument(..., help="An event file, YAML or JSON."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Check an event file against the loaded modules, without storing it."""

    async def work(ctx: Context) -> str:
        definition = load_file(file, ctx.registry)
        return f"{file}: ok — event {definition.id!r}, {len(definition.phases)} phases, " + (
            f"{sum(len(p.steps) for p in definition.phases)} steps"
        )

    console.print(_run(database_url, config, work), highlight=False)


@event_app.command("apply")
def event_apply(
    file: Path = typer.Argument(..., help="An event file, YAML or JSON."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Validate an event file and store it as the event's newest version."""

    async def work(ctx: Context) -> str:
        row = await _apply(ctx, file)
        return f"event {row.event_id!r} version {row.version}"

    console.print(_run(database_url, config, work), highlight=False)


async def _apply(ctx: Context, file: Path) -> Any:
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

    async def work(ctx: Context) -> list[Any]:
        return await ctx.store.list_events()

    rows = _run(database_url, config, work)
    if as_json:
        _print_json([{"id": r.event_id, "version": r.version, "title": r.title} for r in rows])
        return
    table = Table("event", "version", "title", "phases", "schedule")
    for r in rows:
        schedule = r.definition.get("schedule") or {}
        when = schedule.get("cron") or (f"{len(schedule['at'])} times" if schedule.get("at") else "")
        if schedule.get("cron") and schedule.get("timezone", "UTC") != "UTC":
            when += f" ({schedule['timezone']})"
        table.add_row(r.event_id, str(r.version), r.title, str(len(r.definition.get("phases", []))), when)
    console.print(table)


# -- runs -------------------------------------------------------------------------------


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{pair!r}: write --param name=value")
        params[name.strip()] = value
    return params


@run_app.command("start")
def run_start(
    event: str = typer.Argument(..., help="An applied event's id, or an event file (applied first)."),
    param: list[str] = typer.Option([], "--param", "-p", help="A parameter, name=value; repeatable."),
    wait: bool = typer.Option(False, "--wait", help="Work the run here until it ends and is cleaned up."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Start a run of an event. Without --wait a `roadie worker` carries it out."""
    params = _parse_params(param)

    async def work(ctx: Context) -> RunRow:
        path = Path(event)
        row = await _apply(ctx, path) if path.suffix in (".yaml", ".yml", ".json") and path.exists() else None
        if row is None:
            row = await ctx.store.get_event(event)
        run = await ctx.engine.start_run(row, params, actor=os.environ.get("USER", "cli"))
        if not wait:
            return run
        view = RunProgress(console if not as_json else Console(quiet=True))
        view.watch(run.id, run.definition)
        ctx.engine.observer = view
        with view:
            [ended] = await ctx.engine.settle([run.id])
        return ended

    run = _run(database_url, config, work)
    if as_json:
        _print_json(_run_dict(run))
    else:
        console.print(f"run {run.id} of {run.event_id!r}: {_styled(run.status)}, cleanup {_styled(run.cleanup_status)}")
    if wait and run.status != "succeeded":
        raise typer.Exit(1)


def _run_dict(run: RunRow) -> dict[str, Any]:
    data = asdict(run)
    data.pop("definition")
    return data


@run_app.command("list")
def run_list(
    status: str | None = typer.Option(None, "--status", help="Only runs in this state."),
    event: str | None = typer.Option(None, "--event", help="Only runs of this event."),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """List runs, newest first."""

    async def work(ctx: Context) -> list[RunRow]:
        return await ctx.store.list_runs(status=status, event_id=event, limit=limit)

    runs = _run(database_url, config, work)
    if as_json:
        _print_json([_run_dict(r) for r in runs])
        return
    table = Table("run", "event", "status", "cleanup", "phase", "created", "error")
    for r in runs:
        phases = len(r.definition.get("phases", []))
        table.add_row(
            str(r.id),
            r.event_id,
            _styled(r.status),
            _styled(r.cleanup_status),
            f"{min(r.phase + 1, phases)}/{phases}",
            r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            (r.error or "")[:60],
        )
    console.print(table)


@run_app.command("show")
def run_show(
    run_id: int = typer.Argument(..., metavar="RUN"),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """A run: its state, its steps with their attempts, its ledger and its cleanup report."""

    async def work(ctx: Context) -> tuple[RunRow, list[Any], list[Any]]:
        run = await ctx.store.get_run(run_id)
        return run, await ctx.store.list_steps(run_id), await ctx.store.list_resources(run_id)

    run, steps, resources = _run(database_url, config, work)
    if as_json:
        _print_json(
            {
                "run": _run_dict(run),
                "steps": [asdict(s) for s in steps],
                "resources": [asdict(r) for r in resources],
            }
        )
        return
    console.print(
        f"[bold]run {run.id}[/] · {run.event_id} v{run.event_version} · {_styled(run.status)} · "
        f"cleanup {_styled(run.cleanup_status)} ({run.cleanup_policy})"
    )
    console.print(f"params {json.dumps(run.params)}", highlight=False)
    if run.error:
        console.print(f"[red]error[/] {run.error}", highlight=False)
    names = [p["name"] for p in run.definition.get("phases", [])]
    table = Table("phase", "step", "action", "status", "attempts", "error", title="steps")
    for s in steps:
        table.add_row(
            names[s.phase] if s.phase < len(names) else str(s.phase),
            s.name,
            s.action,
            _styled(s.status),
            f"{s.attempts}/{s.max_attempts}",
            (s.error or "; ".join(s.rejections or []))[:70],
        )
    console.print(table)
    ledger = Table("id", "owner", "kind", "ref", "state", "member", "until", "error", title="ledger")
    for r in resources:
        ledger.add_row(
            str(r.id),
            r.owner,
            r.kind,
            r.ref,
            _styled(r.state),
            r.member_key or "",
            r.until.strftime("%H:%M:%S") if r.until else "",
            (r.error or "")[:50],
        )
    console.print(ledger)
    if run.cleanup_report:
        console.print(f"cleanup report {json.dumps(run.cleanup_report)}", highlight=False)


@run_app.command("cancel")
def run_cancel(
    run_id: int = typer.Argument(..., metavar="RUN"),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Cancel a run: no new dispatches; in-flight steps answer; then cleanup per the event's policy."""

    async def work(ctx: Context) -> bool:
        return await ctx.engine.cancel_run(run_id, actor=os.environ.get("USER", "cli"))

    if _run(database_url, config, work):
        console.print(f"run {run_id}: cancel requested")
    else:
        err.print(f"run {run_id} is not in flight (or is already being cancelled)")
        raise typer.Exit(1)


# -- cleanup ----------------------------------------------------------------------------


@app.command()
def cleanup(
    run_id: int = typer.Argument(..., metavar="RUN"),
    plan: bool = typer.Option(False, "--plan", help="List what cleanup would call, and call nothing."),
    member: str | None = typer.Option(None, "--member", help="Only the resources of this memberKey."),
    again: bool = typer.Option(False, "--again", help="Clean up again after 'incomplete' or 'complete'."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Then ask each module to inspect what was reverted, and revert again whatever came back.",
    ),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Revert everything a run left in the world, newest first, and report."""
    verified: Any = None

    async def work(ctx: Context) -> Any:
        nonlocal verified
        if plan:
            return await ctx.engine.cleanup.plan(run_id, member)
        run = await ctx.store.get_run(run_id)
        retry = again or run.cleanup_status in ("incomplete", "complete", "not_required")
        actor = os.environ.get("USER", "cli")
        report = await ctx.engine.clean_up(run_id, actor=actor, member_key=member, again=retry)
        if verify:
            verified = await ctx.engine.cleanup.verify(run_id, actor=actor)
        return report

    result = _run(database_url, config, work)
    if plan:
        if as_json:
            _print_json([asdict(c) for c in result])
            return
        table = Table("call", "step", "action", "key", "resources", title=f"cleanup plan for run {run_id}")
        for c in result:
            refs = ", ".join(f"{r['kind']} {r['ref']}" for r in c.resources[:4])
            more = f" +{len(c.resources) - 4}" if len(c.resources) > 4 else ""
            table.add_row(
                c.kind, c.step, c.action, c.idempotency_key, (refs + more) or "[dim](whatever this key made)[/]"
            )
        console.print(table if result else f"run {run_id}: nothing to clean up")
        return
    if as_json:
        _print_json({**result.as_dict(), "verify": verified.as_dict() if verified else None})
    else:
        console.print(
            f"run {run_id} cleanup {_styled(result.status)}: {result.reverted} reverted, {result.restored} restored, "
            f"{result.failed} failed in {result.calls} calls"
        )
        for e in result.errors:
            console.print(f"  [red]✗[/] resource {e['resource']} ({e['step']}): {e['error']}", highlight=False)
        for f in result.forgotten:
            console.print(f"  [magenta]forgotten[/] {f['kind']} {f['ref']}: {f['why']}", highlight=False)
        if verified is not None:
            v = verified
            console.print(
                f"run {run_id} verified {v.verified}: {v.came_back} came back, {v.redone} reverted again, "
                f"{v.foreign} reused by others (left alone), {v.failed} failed, {v.unverifiable} unverifiable",
                highlight=False,
            )
            for r in v.resources:
                console.print(f"  [yellow]↺[/] {r['kind']} {r['ref']} ({r['step']}) came back", highlight=False)
            for e in v.errors:
                console.print(f"  [red]✗[/] {e['step']}: {e['error']}", highlight=False)
            if v.modules_without_inspect:
                console.print(f"  not inspectable: {', '.join(v.modules_without_inspect)}", highlight=False)
    if result.status != "complete" or (verified is not None and verified.failed):
        raise typer.Exit(1)


@app.command()
def forget(
    resource_id: int = typer.Argument(..., metavar="RESOURCE", help="The ledger row's id (see `run show`)."),
    reason: str = typer.Option(..., "--reason", help="Why it can never be reverted; kept in the audit log."),
    actor: str = typer.Option(os.environ.get("USER", "admin"), "--actor", help="Who is forgetting it."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Admin: give up on a resource that can never be reverted (its module is gone for good)."""

    async def work(ctx: Context) -> Any:
        return await ctx.engine.cleanup.forget(resource_id, actor=actor, reason=reason)

    row = _run(database_url, config, work)
    console.print(f"resource {row.id} ({row.kind} {row.ref}) of run {row.run_id} is forgotten; audited")


@app.command()
def leases(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Leases in force across the world: which run holds which target, until when."""

    async def work(ctx: Context) -> list[Any]:
        return await ctx.store.leases_in_force()

    rows = _run(database_url, config, work)
    if as_json:
        _print_json([asdict(r) for r in rows])
        return
    table = Table("target", "run", "state", "saved value", "until")
    for r in rows:
        saved = json.dumps(r.payload.get("saved")) if isinstance(r.payload, dict) else ""
        table.add_row(r.ref, str(r.run_id), _styled(r.state), saved, r.until.isoformat() if r.until else "cleanup")
    console.print(table if rows else "no leases in force")


@app.command()
def audit(
    run_id: int | None = typer.Option(None, "--run", help="Only entries about this run."),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """The audit log: who did what, newest first."""

    async def work(ctx: Context) -> list[Any]:
        return await ctx.store.list_audit(f"run:{run_id}" if run_id else None, limit)

    rows = _run(database_url, config, work)
    if as_json:
        _print_json([asdict(r) for r in rows])
        return
    table = Table("at", "actor", "action", "subject", "detail")
    for r in rows:
        table.add_row(r.at.strftime("%Y-%m-%d %H:%M:%S"), r.actor, r.action, r.subject, json.dumps(r.detail)[:80])
    console.print(table)


# -- sandbox ----------------------------------------------------------------------------


@sandbox_app.command("show")
def sandbox_show(
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
    url: str | None = typer.Option(None, "--url", help="Read a `roadie sandbox serve` at this URL instead."),
    secret: str | None = SecretOption,
) -> None:
    """The sandbox world's state: regions, settings, creatures, items, active buffs."""

    async def work(ctx: Context) -> dict[str, Any]:
        snapshot: dict[str, Any] = ctx.registry.state("sandbox").snapshot()
        return snapshot

    if url:
        if not secret:
            err.print("[red]error[/] --url needs the server's --secret (or ROADIE_SANDBOX_SECRET)", highlight=False)
            raise typer.Exit(1)
        try:
            snapshot = fetch_world(url, secret)
        except RoadieError as exc:
            err.print(f"[red]error[/] {exc.message}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
    else:
        snapshot = _run(database_url, config, work)
    if as_json:
        _print_json(snapshot)
        return
    from roadie.cli.demo import world_table

    console.print(world_table({"now": snapshot}, title="sandbox world"))


sandbox_app.command("serve")(sandbox_serve)


@app.command()
def demo(
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Run the bundled invasion against the sandbox world with faults on, clean up, and
    compare the world before and after. Exits 0 only if they are equal."""
    from roadie.cli.demo import run_demo

    equal = _run(database_url, config, lambda ctx: run_demo(ctx, console))
    raise typer.Exit(0 if equal else 1)


# -- the web: roadie serve, roadie token --------------------------------------------------

token_app = typer.Typer(help="API tokens of `roadie serve`: create, list, revoke.", no_args_is_help=True)
app.add_typer(token_app, name="token")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="Port to listen on."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve only; leave the runs to `roadie worker`s."),
    concurrency: int | None = typer.Option(None, "--concurrency", min=1, help="The embedded worker's concurrency."),
    secret_key: str | None = typer.Option(
        None,
        "--secret-key",
        envvar="ROADIE_SECRET_KEY",
        help="Signs session cookies (env ROADIE_SECRET_KEY). Default: random per process, so sessions end "
        "on restart; give every server behind one address the same key.",
    ),
    secure_cookies: bool = typer.Option(False, "--secure-cookies", help="Mark the session cookie Secure (HTTPS)."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Serve the HTTP API (/api/v1, OpenAPI at /openapi.json), the dashboard, /metrics and
    /healthz, with an embedded worker unless --no-worker. SIGTERM or Ctrl-C stops it
    gracefully: the worker lets in-flight steps answer first."""
    import uvicorn

    from roadie.web import WebOptions, create_app

    options = WebOptions(database_url=database_url, config=config, worker=not no_worker, concurrency=concurrency)
    if secret_key:
        options.secret_key = secret_key
    options.secure_cookies = secure_cookies
    err.print(f"roadie serve on http://{host}:{port} (worker {'off' if no_worker else 'on'})", highlight=False)
    uvicorn.run(create_app(options), host=host, port=port, log_level="warning", access_log=False)


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

    row = _run(database_url, config, work)
    if as_json:
        _print_json({"id": row.id, "name": row.name, "role": row.role, "key": row.key, "token": minted.token})
        return
    sys.stdout.write(minted.token + "\n")
    err.print(f"token {row.name!r} ({row.role}) created; it is shown this once", highlight=False)


@token_app.command("list")
def token_list(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Every token, revoked ones too. Secrets are never shown again."""

    async def work(ctx: Context) -> list[Any]:
        return await ctx.store.list_tokens()

    rows = _run(database_url, config, work)
    if as_json:
        _print_json([{k: v for k, v in asdict(r).items() if k != "secret_hash"} for r in rows])
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

    row = _run(database_url, config, work)
    console.print(f"token {row.name!r} revoked", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()

"""`roadie run`: start, list, show and cancel runs."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from roadie.cli.common import ConfigOption, DatabaseOption, JsonOption, console, err, in_context, print_json, styled
from roadie.cli.events import apply_event
from roadie.cli.progress import RunProgress
from roadie.runtime import Context
from roadie.store.rows import RunRow

run_app = typer.Typer(help="Runs: start, list, show, cancel.", no_args_is_help=True)


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
        row = await apply_event(ctx, path) if path.suffix in (".yaml", ".yml", ".json") and path.exists() else None
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

    run = in_context(database_url, config, work)
    if as_json:
        print_json(_run_dict(run))
    else:
        console.print(f"run {run.id} of {run.event_id!r}: {styled(run.status)}, cleanup {styled(run.cleanup_status)}")
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

    runs = in_context(database_url, config, work)
    if as_json:
        print_json([_run_dict(r) for r in runs])
        return
    table = Table("run", "event", "status", "cleanup", "phase", "created", "error")
    for r in runs:
        phases = len(r.definition.get("phases", []))
        table.add_row(
            str(r.id),
            r.event_id,
            styled(r.status),
            styled(r.cleanup_status),
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

    run, steps, resources = in_context(database_url, config, work)
    if as_json:
        print_json(
            {
                "run": _run_dict(run),
                "steps": [asdict(s) for s in steps],
                "resources": [asdict(r) for r in resources],
            }
        )
        return
    console.print(
        f"[bold]run {run.id}[/] · {run.event_id} v{run.event_version} · {styled(run.status)} · "
        f"cleanup {styled(run.cleanup_status)} ({run.cleanup_policy})"
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
            styled(s.status),
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
            styled(r.state),
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

    if in_context(database_url, config, work):
        console.print(f"run {run_id}: cancel requested")
    else:
        err.print(f"run {run_id} is not in flight (or is already being cancelled)")
        raise typer.Exit(1)

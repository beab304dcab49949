"""The cleanup commands: cleanup (with its plan and verify), forget, leases, audit."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from roadie.cli.common import (
    ConfigOption,
    DatabaseOption,
    JsonOption,
    clip,
    console,
    in_context,
    line,
    print_json,
    styled,
)
from roadie.runtime import Context


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

    result = in_context(database_url, config, work, as_json=as_json)
    if plan:
        if as_json:
            print_json([asdict(c) for c in result])
            return
        table = Table("call", "step", "action", "key", "resources", title=f"cleanup plan for run {run_id}")
        for c in result:
            refs = ", ".join(f"{r['kind']} {r['ref']}" for r in c.resources[:4])
            more = f" +{len(c.resources) - 4}" if len(c.resources) > 4 else ""
            table.add_row(
                c.kind,
                c.step,
                c.action,
                c.idempotency_key,
                (refs + more) or Text("(whatever this key made)", style="dim"),
            )
        console.print(table if result else f"run {run_id}: nothing to clean up")
        return
    if as_json:
        print_json({**result.as_dict(), "verify": verified.as_dict() if verified else None})
    else:
        console.print(
            line(
                f"run {run_id} cleanup ",
                styled(result.status),
                f": {result.reverted} reverted, {result.restored} restored, {result.failed} failed in "
                f"{result.calls} calls",
            )
        )
        for e in result.errors:
            console.print(line("  ", ("✗", "red"), f" resource {e['resource']} ({e['step']}): {e['error']}"))
        for f in result.forgotten:
            console.print(line("  ", ("forgotten", "magenta"), f" {f['kind']} {f['ref']}: {f['why']}"))
        if verified is not None:
            v = verified
            console.print(
                f"run {run_id} verified {v.verified}: {v.came_back} came back, {v.redone} reverted again, "
                f"{v.foreign} reused by others (left alone), {v.failed} failed, {v.unverifiable} unverifiable",
            )
            for r in v.resources:
                console.print(line("  ", ("↺", "yellow"), f" {r['kind']} {r['ref']} ({r['step']}) came back"))
            for e in v.errors:
                console.print(line("  ", ("✗", "red"), f" {e['step']}: {e['error']}"))
            if v.modules_without_inspect:
                console.print(f"  not inspectable: {', '.join(v.modules_without_inspect)}")
    if result.status != "complete" or (verified is not None and verified.failed):
        raise typer.Exit(1)


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

    row = in_context(database_url, config, work)
    console.print(f"resource {row.id} ({row.kind} {row.ref}) of run {row.run_id} is forgotten; audited")


def leases(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Leases in force across the world: which run holds which target, until when."""

    async def work(ctx: Context) -> list[Any]:
        return await ctx.store.leases_in_force()

    rows = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    table = Table("target", "run", "state", "saved value", "until")
    for r in rows:
        saved = json.dumps(r.payload.get("saved")) if isinstance(r.payload, dict) else ""
        table.add_row(r.ref, str(r.run_id), styled(r.state), saved, r.until.isoformat() if r.until else "cleanup")
    console.print(table if rows else "no leases in force")


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

    rows = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    table = Table("at", "actor", "action", "subject", "detail")
    for r in rows:
        table.add_row(r.at.strftime("%Y-%m-%d %H:%M:%S"), r.actor, r.action, r.subject, clip(json.dumps(r.detail), 80))
    console.print(table)

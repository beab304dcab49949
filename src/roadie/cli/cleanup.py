"""The cleanup commands: cleanup (with its plan and verify), sweep, forget, leases, audit."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

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
    in_store,
    line,
    print_json,
    styled,
)
from roadie.states import CleanupStatus

if TYPE_CHECKING:
    from roadie.engine.cleanup import PreviewGroup
    from roadie.runtime import Context


def cleanup(
    run_id: int = typer.Argument(..., metavar="RUN", help="The run's id."),
    plan: bool = typer.Option(
        False, "--plan", help="Show what cleanup would take down, by module and kind, and its calls; call nothing."
    ),
    member: str | None = typer.Option(None, "--member", metavar="KEY", help="Only the resources of this memberKey."),
    again: bool = typer.Option(False, "--again", help="Clean up again after 'incomplete' or 'complete'."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Another round now, also for a complete run: read the world back, and revert again what came back; "
        "exit 1 if anything came back (the cleanup is then rolled_back, and the next round reads it back).",
    ),
    confirm: bool = typer.Option(
        False, "--confirm", help="Go ahead though a module has more to revert than its cap (audited)."
    ),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Revert everything a run left in the world, newest first, then read the world back
    and report a verdict: verified clean, partially rolled back, or unverified.

    Exit 0 when the cleanup ends complete; exit 1 when it does not: held over a cap,
    incomplete, or rolled back (something came back, with --verify or without).
    """

    async def work(ctx: Context) -> Any:
        if plan:
            return await ctx.engine.cleanup.preview(run_id, member), await ctx.engine.cleanup.plan(run_id, member)
        run = await ctx.store.get_run(run_id)
        retry = again or verify or run.cleanup_status != CleanupStatus.PENDING.value
        actor = os.environ.get("USER", "cli")
        return await ctx.engine.clean_up(run_id, actor=actor, member_key=member, again=retry, confirm=confirm)

    result = in_context(database_url, config, work, as_json=as_json)
    if plan:
        preview, calls = result
        if as_json:
            from roadie import views

            print_json(
                {
                    "summary": views.shown_all(views.PreviewGroup, preview),
                    "calls": views.shown_all(views.PlannedCall, calls),
                }
            )
            return
        if not calls:
            console.print(f"run {run_id}: nothing to clean up")
            return
        console.print(preview_table(preview, title=f"what cleanup would take down for run {run_id}"))
        for g in preview:
            if g.over_cap:
                console.print(
                    line(("held", "yellow"), f" {g.module} has more than its cap of {g.cap}: `--confirm` to go ahead")
                )
                break
        table = Table("call", "step", "action", "key", "resources", title="its calls, in order")
        for c in calls[:PLAN_CALLS]:
            refs = ", ".join(f"{r['kind']} {r['ref']}" for r in c.resources[:4])
            more = f" +{len(c.resources) - 4}" if len(c.resources) > 4 else ""
            table.add_row(
                c.kind,
                c.step,
                c.action,
                c.idempotency_key,
                (refs + more) or Text("(whatever this key made)", style="dim"),
            )
        console.print(table)
        if len(calls) > PLAN_CALLS:
            console.print(f"… and {len(calls) - PLAN_CALLS} more calls (--json lists them all)")
        return
    if as_json:
        from roadie import views

        print_json(views.shown(views.CleanupReport, result.as_dict()))
    else:
        console.print(
            line(
                f"run {run_id} cleanup ",
                styled(result.status),
                f": {result.reverted} reverted, {result.restored} restored, {result.failed} failed in "
                f"{result.calls} calls"
                + (f"; {result.left_alone} changed since, left alone" if result.left_alone else ""),
            )
        )
        for e in result.errors:
            console.print(line("  ", ("✗", "red"), f" resource {e['resource']} ({e['step']}): {e['error']}"))
        for f in result.forgotten:
            console.print(line("  ", ("forgotten", "magenta"), f" {f['kind']} {f['ref']}: {f['why']}"))
        for module, over in result.over_cap.items():
            mark = ("confirmed", "green") if result.status != "held" else ("held", "yellow")
            console.print(line("  ", mark, f" {module}: {over['count']} to revert, over its cap of {over['cap']}"))
        if result.status == "held":
            console.print(f"  nothing was reverted: see `roadie cleanup {run_id} --plan`, then add --confirm")
        for text in verdict_lines(result.verification) + late_lines(result.late):
            console.print(text)
    if result.status != "complete":
        raise typer.Exit(1)


PLAN_CALLS = 50  # calls a plan lists as text; --json lists every one


def preview_table(groups: list[PreviewGroup], *, title: str) -> Table:
    """Counts per module and kind, and the newest few of each in the world's words."""
    table = Table("module", "kind", "count", "newest", "cap", title=title)
    for g in groups:
        cap = "" if g.cap is None else (Text(f"over {g.cap}", style="yellow") if g.over_cap else str(g.cap))
        table.add_row(g.module, g.kind, str(g.count), "; ".join(g.newest), cap)
    return table


def late_lines(entries: list[dict[str, Any]]) -> list[Text]:
    """What came long after its moment because no worker was alive then."""
    return [
        line("  ", ("late", "yellow"), f" {e['what']}: {e['late_s']:.0f} s after it was due ({e['due']})")
        for e in entries
    ]


VERDICT_STYLE = {"verified_clean": "green", "partially_rolled_back": "red", "unverified": "yellow"}
FINDING_MARK = {
    "came_back": ("↺ came back", "yellow"),
    "still_there": ("↺ still there", "yellow"),
    "not_inspected": ("? not inspected", "red"),
    "unverifiable": ("? unverifiable", "yellow"),
    "foreign": ("· not the run's", "dim"),
    "changed": ("· changed since", "dim"),
}


def verdict_lines(found: dict[str, Any]) -> list[Text]:
    """A cleanup's verdict as a person reads it: the verdict, its counts, then each finding."""
    if not found:
        return []
    verdict = str(found["verdict"])
    counts = [
        f"{found[k]} {k.replace('_', ' ')}"
        for k in ("came_back", "still_there", "not_inspected", "unverifiable", "foreign", "changed")
        if found.get(k)
    ]
    head = f": {found['inspected']} read back, {found['gone']} gone" + "".join(f", {c}" for c in counts)
    from roadie.engine.verify import LISTED

    lines = [line("verdict ", (verdict.replace("_", " "), VERDICT_STYLE.get(verdict, "")), head)]
    if verdict == "partially_rolled_back" and (found.get("came_back") or found.get("still_there")):
        lines.append(line("  what came back was reverted again; the next cleanup round reads it back"))
    if found.get("modules_without_inspect"):
        lines.append(line(f"  cannot inspect: {', '.join(found['modules_without_inspect'])}"))
    for f in found.get("findings", []):
        mark = FINDING_MARK.get(f["finding"], (f["finding"], ""))
        detail = f": {f['detail']}" if f.get("detail") else ""
        lines.append(line("  ", mark, f" {f['kind']} {f['ref']} (resource {f['resource']}, {f['step']}){detail}"))
    if len(found.get("findings", [])) >= LISTED:
        lines.append(line(f"  … only the first {LISTED} are named; the counts above are of all"))
    return lines


def sweep(
    plan: bool = typer.Option(False, "--plan", help="Find the orphans and revert nothing."),
    module: str | None = typer.Option(None, "--module", metavar="NAME", help="Only this module."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Take down what modules hold tagged for runs that have ended and no ledger row names
    (summons, respawns, what a lost answer made), by the tag's own step; audited."""

    async def work(ctx: Context) -> Any:
        return await ctx.engine.sweeper.sweep(plan=plan, actor=os.environ.get("USER", "cli"), only=module)

    reports = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        print_json([r.as_dict() for r in reports])
        return
    if not reports:
        console.print("no module loaded can list what it holds tagged: nothing to sweep")
        return
    for r in reports:
        did = "would revert" if plan else f"{r.reverted} reverted, {r.failed} failed"
        console.print(
            line(
                (r.module, "bold"),
                f": {r.listed} tagged, {r.orphans} orphans ({did}); {r.in_ledger} in the ledger, "
                f"{r.in_flight} of runs in flight, {r.unknown} of keys not ours",
            )
        )
        for f in r.found:
            console.print(line("  ", ("orphan", "yellow"), f" {f['kind']} {f['ref']} of run {f['run']} ({f['step']})"))
        for e in r.errors:
            console.print(line("  ", ("✗", "red"), f" {e.get('key', '')} {e['error']}"))
    if any(r.failed or r.errors for r in reports):
        raise typer.Exit(1)


def forget(
    resource_id: int = typer.Argument(..., metavar="RESOURCE", help="The ledger row's id (see `run show`)."),
    reason: str = typer.Option(..., "--reason", help="Why it can never be reverted; kept in the audit log."),
    actor: str = typer.Option(os.environ.get("USER", "admin"), "--actor", help="Who is forgetting it."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Admin: give up on a resource that can never be reverted (its module is gone for good).
    With --json, the ledger row as it is now (abandoned), as the HTTP API answers."""

    async def work(ctx: Context) -> Any:
        await ctx.engine.cleanup.forget(resource_id, actor=actor, reason=reason)
        return await ctx.store.get_resource(resource_id)  # as it is now, as the HTTP API answers

    row = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        from roadie import views

        print_json(views.shown(views.Resource, row))
        return
    console.print(f"resource {row.id} ({row.kind} {row.ref}) of run {row.run_id} is forgotten; audited")


def leases(
    as_json: bool = JsonOption, database_url: str | None = DatabaseOption, config: str | None = ConfigOption
) -> None:
    """Leases in force across the world: which run holds which target, until when."""
    from roadie import views
    from roadie.store.leases import LeaseQueries

    async def work(store: LeaseQueries) -> list[Any]:
        return await store.leases_in_force()

    found = [views.Lease.of(r) for r in in_store(database_url, config, LeaseQueries, work, as_json=as_json)]
    if as_json:
        print_json(views.shown_all(views.Lease, found))
        return
    table = Table("target", "run", "state", "saved value", "layer", "until")
    for lease in found:
        saved = json.dumps(lease.saved) if lease.saved is not None else ""
        layer = f"priority {lease.priority}: {json.dumps(lease.value)}" if lease.priority is not None else ""
        until = lease.until.isoformat() if lease.until else "cleanup"
        table.add_row(lease.target, str(lease.run_id), styled(lease.state), saved, layer, until)
    console.print(table if found else "no leases in force")


def audit(
    run_id: int | None = typer.Option(None, "--run", metavar="RUN", help="Only entries about this run."),
    actor: str | None = typer.Option(None, "--actor", help="Only entries by this token's name (or `cli`)."),
    action: str | None = typer.Option(None, "--action", help="Only this action (run.start), or all under it (run)."),
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=1000),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """The audit log: who did what, newest first."""

    from roadie.store.audit import AuditQueries

    async def work(store: AuditQueries) -> list[Any]:
        return await store.list_audit(f"run:{run_id}" if run_id else None, limit, actor=actor, action=action)

    rows = in_store(database_url, config, AuditQueries, work, as_json=as_json)
    if as_json:
        from roadie import views

        print_json(views.shown_all(views.AuditEntry, rows))
        return
    table = Table("at", "actor", "action", "subject", "detail")
    for r in rows:
        table.add_row(r.at.strftime("%Y-%m-%d %H:%M:%S"), r.actor, r.action, r.subject, clip(json.dumps(r.detail), 80))
    console.print(table)

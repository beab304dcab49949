"""`roadie run`: start, list, show and cancel runs."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from roadie.cli.cleanup import late_lines, preview_table, verdict_lines
from roadie.cli.common import (
    ConfigOption,
    DatabaseOption,
    JsonOption,
    clip,
    console,
    err,
    group,
    in_context,
    in_store,
    line,
    make_console,
    name_values,
    print_json,
    styled,
)
from roadie.cli.events import apply_event
from roadie.errors import InvalidState, PreflightRefused
from roadie.states import CleanupStatus, RunStatus

if TYPE_CHECKING:
    import asyncio

    from roadie.engine.cleanup import PreviewGroup
    from roadie.runtime import Context
    from roadie.store.rows import RunRow

run_app = group("Runs: start, list, show, cancel.")


@run_app.command("start")
def run_start(
    event: str = typer.Argument(..., metavar="EVENT", help="An applied event's id, or an event file (applied first)."),
    param: list[str] = typer.Option(
        [],
        "--param",
        "-p",
        metavar="NAME=VALUE",
        help="A parameter of the event; one -p for each (a list or a dict as JSON).",
    ),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Work the run here until it ends and is cleaned up; exit 1 if it did not succeed, or if its cleanup "
        "ended held (over a cap), incomplete or rolled back, as `roadie cleanup` does. Ctrl-C stops working it once "
        "what is in flight has answered, and says what it leaves to the workers.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Start even though pre-flight found a setting another run holds or a module offline; the override "
        "is in the audit log (run.force).",
    ),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Start a run of an event. Without --wait a `roadie worker` carries it out.

    Before anything is stored or sent, pre-flight looks at the settings the run would
    borrow and the modules it would call: a setting another run holds, or a module that
    is offline, refuses the start, naming it, with exit code 75 (try again later), unless
    --force."""
    from roadie import views
    from roadie.cli.progress import RunProgress
    from roadie.engine import settled
    from roadie.runtime import freeze_heap

    params = name_values(param, "--param")
    left: Left | None = None

    async def work(ctx: Context) -> RunRow:
        nonlocal left
        path = Path(event)
        row = await apply_event(ctx, path) if path.suffix in (".yaml", ".yml", ".json") and path.exists() else None
        if row is None:
            row = await ctx.store.get_event(event)
        try:
            run = await ctx.engine.start_run(row, params, actor=os.environ.get("USER", "cli"), force=force)
        except PreflightRefused as exc:
            raise exc.saying("--force") from None
        if not wait:
            return run
        view = RunProgress(console if not as_json else make_console(quiet=True))
        view.watch(run.id, run.definition)
        ctx.engine.observer = view
        freeze_heap()
        with view, _interruptible(ctx, run.id) as interrupted:
            [ended] = await ctx.engine.settle([run.id])
        if interrupted.is_set() and not settled(ended):
            left = await _what_is_left(ctx, ended)
        return ended

    run = in_context(database_url, config, work, as_json=as_json)
    if left is not None:
        run = _hand_over(left, as_json=as_json, database_url=database_url, config=config)
    if as_json:
        print_json(views.shown(views.Run, run))
    else:
        console.print(
            line(f"run {run.id} of {run.event_id!r}: ", styled(run.status), ", cleanup ", styled(run.cleanup_status))
        )
    if wait and (run.status != "succeeded" or run.cleanup_status in UNRESTORED):
        raise typer.Exit(1)


# A cleanup that ended so leaves the world not restored: `--wait` exits 1, as `roadie
# cleanup` does. `pending` is not among them: a manual run's cleanup waits for a person.
UNRESTORED = frozenset({CleanupStatus.HELD.value, CleanupStatus.INCOMPLETE.value, CleanupStatus.ROLLED_BACK.value})


@dataclass
class Left:
    """What an interrupted `--wait` leaves behind: a run still in flight, its live
    resources, and whether a worker is alive to carry it on."""

    run: RunRow
    live: int
    workers: int


@contextmanager
def _interruptible(ctx: Context, run_id: int) -> Iterator[asyncio.Event]:
    """The first Ctrl-C stops working the run once what is in flight has answered (nothing
    is left half-recorded); a second one quits at once."""
    import asyncio

    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()

    def on_interrupt() -> None:
        interrupted.set()
        ctx.engine.stop()
        loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C is Python's own
        err.print(f"\nstopping work on run {run_id} once what is in flight has answered (Ctrl-C again to quit at once)")

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    try:
        yield interrupted
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _what_is_left(ctx: Context, run: RunRow) -> Left:
    now = ctx.engine.clock.now()
    workers = await ctx.store.list_workers(now, ctx.engine.options.claim_ttl)
    return Left(run, await ctx.store.count_live_resources(run.id), sum(w.state == "alive" for w in workers))


def _hand_over(left: Left, *, as_json: bool, database_url: str | None, config: str | None) -> RunRow:
    """Say what the interrupted run leaves in the world and who carries it on; at a
    terminal, offer to cancel it and clean up here instead."""
    run = left.run
    carried = (
        f"{left.workers} worker(s) alive will carry it on"
        if left.workers
        else "no worker is alive: start `roadie worker` to carry it on"
    )
    err.print(
        f"run {run.id} is {run.status} (phase {_phase(run)}, cleanup {run.cleanup_status}) "
        f"with {left.live} resource(s) live in the world; it is left to the workers: {carried}, "
        f"or `roadie run cancel {run.id}` cancels it and cleans up.",
        soft_wrap=True,
    )
    if as_json or not sys.stdin.isatty() or not typer.confirm("Cancel it and clean up now, here?", default=False):
        return run

    async def cancel(ctx: Context) -> RunRow:
        await ctx.engine.cancel_run(run.id, actor=os.environ.get("USER", "cli"))
        [ended] = await ctx.engine.settle([run.id])
        return ended

    return in_context(database_url, config, cancel)


def _phase(run: RunRow) -> str:
    """Where the run stands, as "phase/phases" (the last once it is past them all)."""
    phases = len(run.definition.get("phases", []))
    return f"{min(run.phase + 1, phases)}/{phases}"


@run_app.command("list")
def run_list(
    status: str | None = typer.Option(None, "--status", metavar="STATE", help="Only runs in this state."),
    event: str | None = typer.Option(None, "--event", help="Only runs of this event."),
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=1000),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """List runs, newest first."""

    from roadie.store.runs import RunQueries

    async def work(store: RunQueries) -> list[RunRow]:
        return await store.list_runs(status=status, event_id=event, limit=limit)

    runs = in_store(database_url, config, RunQueries, work, as_json=as_json)
    if as_json:
        from roadie import views

        print_json(views.shown_all(views.Run, runs))
        return
    table = Table("run", "event", "status", "cleanup", "phase", "created", "error")
    for r in runs:
        table.add_row(
            str(r.id),
            r.event_id,
            styled(r.status),
            styled(r.cleanup_status),
            _phase(r),
            r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            clip(r.error, 60),
        )
    console.print(table)


@run_app.command("show")
def run_show(
    run_id: int = typer.Argument(..., metavar="RUN", help="The run's id."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """A run: its state, its steps with their attempts, its ledger, what it has left in the
    world (in the world's words) and its cleanup report."""

    async def work(ctx: Context) -> tuple[RunRow, list[Any], list[Any], list[PreviewGroup]]:
        run = await ctx.store.get_run(run_id)
        steps, resources = await ctx.store.list_steps(run_id), await ctx.store.list_resources(run_id)
        return run, steps, resources, await ctx.engine.cleanup.preview(run_id)

    run, steps, resources, left = in_context(database_url, config, work, as_json=as_json, looks=True)
    if as_json:
        from roadie import views

        print_json(
            {
                "run": views.shown(views.Run, run),
                "steps": views.shown_all(views.Step, steps),
                "resources": views.shown_all(views.Resource, resources),
                "left_in_world": [asdict(g) for g in left],
            }
        )
        return
    console.print(
        line(
            (f"run {run.id}", "bold"),
            f" · {run.event_id} v{run.event_version} · ",
            styled(run.status),
            " · cleanup ",
            styled(run.cleanup_status),
            f" ({run.cleanup_policy})",
        )
    )
    console.print(f"params {json.dumps(run.params)}")
    if run.error:
        console.print(line(("error", "red"), f" {run.error}"))
    names = [p["name"] for p in run.definition.get("phases", [])]
    table = Table("phase", "step", "action", "status", "attempts", "error", title="steps")
    for s in steps:
        table.add_row(
            names[s.phase] if s.phase < len(names) else str(s.phase),
            s.name,
            s.action,
            styled(s.status),
            f"{s.attempts}/{s.max_attempts}",
            clip(s.error or "; ".join(s.rejections or []), 70),
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
            clip(r.error, 50),
        )
    console.print(ledger)
    if left:
        console.print(preview_table(left, title="left in the world"))
    elif resources:
        console.print("nothing of it is left in the world: its ledger holds no live row")
    if run.cleanup_report:
        rep = run.cleanup_report
        console.print(
            line(
                "last cleanup ",
                styled(str(rep.get("status", ""))),
                f": {rep.get('reverted', 0)} reverted, {rep.get('restored', 0)} restored, "
                f"{rep.get('failed', 0)} failed in {rep.get('calls', 0)} calls",
            )
        )
        for text in verdict_lines(rep.get("verification") or {}) + late_lines(rep.get("late") or []):
            console.print(text)


@run_app.command("cancel")
def run_cancel(
    run_id: int = typer.Argument(..., metavar="RUN", help="The run's id."),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Cancel a run: no new dispatches; in-flight steps answer; then cleanup per the event's
    policy. Asking again is no error; a run that has already ended is (exit 1)."""

    async def work(ctx: Context) -> bool:
        run = await ctx.store.get_run(run_id)  # no such run: NotFound, said as such
        if await ctx.engine.cancel_run(run_id, actor=os.environ.get("USER", "cli")):
            return False
        run = await ctx.store.get_run(run_id)
        if run.cancel_requested and not RunStatus(run.status).terminal:
            return True
        raise InvalidState(f"run {run_id} has already ended ({run.status}); nothing to cancel")

    already = in_context(database_url, config, work, as_json=as_json)
    if as_json:
        # The HTTP API's answer to a cancel, and whether it had been asked for before.
        print_json({"run_id": run_id, "cancel_requested": True, "already_requested": already})
    else:
        console.print(f"run {run_id}: cancel {'already ' if already else ''}requested")

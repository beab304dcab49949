"""One run: its page and the page's live part, its ledger, and cancelling it or
cleaning it up."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup

from roadie.states import (
    CLEANUP_DUE,
    ResourceState,
    StepStatus,
)
from roadie.store.rows import ResourceRow, RunRow
from roadie.web import paging, service
from roadie.web.api import RowId
from roadie.web.auth import Principal, state_of
from roadie.web.dashboard.pages import Operator, Shown, Viewer, back, render, render_text, world_words
from roadie.web.timeline import layout

router = APIRouter(include_in_schema=False)


def _left_in_world(resources: list[ResourceRow], newest: int = 3) -> dict[str, Any]:
    """What a run's ledger says is in the world now, in the world's words: its live rows
    grouped by module and kind with the newest few named, and how many rows are live,
    failed (live, with the error of a revert that did not go), reverted and forgotten."""
    groups: dict[tuple[str, str], list[ResourceRow]] = {}
    counts = dict.fromkeys(("live", "failed", "reverted", "forgotten"), 0)
    for r in reversed(resources):  # newest first
        state = ResourceState(r.state)
        if state.holds_target:
            counts["failed" if r.error else "live"] += 1
            groups.setdefault((r.owner, r.kind), []).append(r)
        elif state is ResourceState.REVERTED:
            counts["reverted"] += 1
        elif state is ResourceState.ABANDONED:
            counts["forgotten"] += 1
    shown = [
        {"owner": owner, "kind": kind, "count": len(rows), "newest": [world_words(r) for r in rows[:newest]]}
        for (owner, kind), rows in groups.items()
    ]
    return {"groups": shown, "counts": counts}


async def _run_context(request: Request, run_id: RowId) -> dict[str, Any]:
    run, steps, resources = await state_of(request).store.run_view(run_id)
    return {
        "run": run,
        "steps": steps,
        "resources": resources,
        "live_rows": sum(1 for r in resources if ResourceState(r.state).holds_target),
        "in_flight": run.status in service.IN_FLIGHT,
        "settled_now": not (run.status in service.IN_FLIGHT or run.cleanup_status in CLEANUP_DUE),
        "params_json": json.dumps(run.params),
    }


def _phase_names(run: RunRow) -> list[str]:
    return [p.get("name", "") for p in run.definition.get("phases", [])]


def _draw_live(request: Request, who: Principal, context: dict[str, Any], f: paging.Filter) -> Markup:
    """The run page's changing part: its summary, timeline, a page of its steps and what
    it left in the world. A run of more steps than a page also counts them by phase,
    action and state, and its timeline draws a row per phase."""
    run, steps = context["run"], context["steps"]
    big = len(steps) > paging.COMPACT_AFTER
    return Markup(
        render_text(
            request,
            "_run_live.html",
            who,
            **context,
            f=f,
            shown=paging.page_of(steps, paging.step_matches(f), f.page),
            tallies=paging.step_tallies(steps, _phase_names(run)) if big or f.narrowed else None,
            left=_left_in_world(context["resources"]),
            phase_names=_phase_names(run),
            timeline=layout(run, steps, state_of(request).clock.now(), compact=big),
        )
    )


async def _run_drawing(request: Request, who: Principal, run_id: int, f: paging.Filter, *, whole: bool) -> str:
    """The run page (`whole`) or its changing part, drawn from the run's rows.

    A run that has ended, with no cleanup under way and no step running, no longer moves
    with the clock, so what is drawn for it is kept (`WebState.drawn`) and given again for
    as long as its rows read back the same, compared as the driver gives them, before any
    decoding: staff reading a finished run, or many watching one, cost one read of it.
    The rows are read for the comparison before the drawing's own read, so a change
    between the two makes the next request draw again rather than keep a stale page. A
    run's first drawing keeps no rows (it is not known to have ended until it is read);
    the next request reads them and draws again."""
    state = state_of(request)
    key = (run_id, who.actor, who.role.value, who.csrf or "", whole, f.query())
    kept = state.drawn.get(key)
    rows = await state.store.run_view_undecoded(run_id) if kept is not None else None
    if kept is not None and kept[0] == rows:
        return kept[1]
    context = await _run_context(request, run_id)
    context["world_notes"] = await state.store.list_audit(f"run:{run_id}", 20, action="world")
    live = _draw_live(request, who, context, f)
    html = render_text(request, "run.html", who, live=live, f=f, **context) if whole else str(live)
    run = context["run"]
    timeless = run.ended_at is not None and not (run.cleanup_started_at and not run.cleanup_ended_at)
    if timeless and not any(s.status == StepStatus.RUNNING.value for s in context["steps"]):
        state.drawn.put(key, (rows, html))
    return html


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: RowId, who: Viewer, f: Shown) -> Response:
    return HTMLResponse(await _run_drawing(request, who, run_id, f, whole=True))


@router.get("/runs/{run_id}/live", response_class=HTMLResponse)
async def run_live(request: Request, run_id: RowId, who: Viewer, f: Shown) -> Response:
    """The changing part of the run page (the page of steps its address names), for htmx
    to swap in on each server-sent event."""
    return HTMLResponse(await _run_drawing(request, who, run_id, f, whole=False))


@router.get("/runs/{run_id}/ledger", response_class=HTMLResponse)
async def ledger_page(request: Request, run_id: RowId, who: Viewer, f: Shown, member: str | None = None) -> Response:
    """A run's ledger: the clean-up card first, then its rows a page at a time (counted by
    phase, action and state once there are more than a page), then the cleanup plan."""
    context = await _run_context(request, run_id)
    calls = await service.plan(state_of(request), run_id, member or None)
    preview = await state_of(request).engine.cleanup.preview(run_id, member or None)
    steps = {s.id: s for s in context["steps"]}
    resources = context["resources"]
    tallies = (
        paging.row_tallies(resources, steps, _phase_names(context["run"]))
        if len(resources) > paging.PAGE_SIZE or f.narrowed
        else None
    )
    return render(
        request,
        "ledger.html",
        who,
        plan=calls,
        preview=preview,
        member=member or "",
        steps_by_id=steps,
        f=f,
        shown=paging.page_of(resources, paging.row_matches(f, steps), f.page),
        tallies=tallies,
        plan_shown=paging.PAGE_SIZE,
        **context,
    )


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, run_id: RowId, who: Operator) -> Response:
    await service.cancel_run(state_of(request), run_id, who.actor)
    return back(f"/runs/{run_id}")


@router.post("/runs/{run_id}/cleanup")
async def cleanup(
    request: Request,
    run_id: RowId,
    who: Operator,
    member_key: Annotated[str, Form(max_length=190)] = "",
    again: Annotated[bool, Form()] = False,
    confirm: Annotated[bool, Form()] = False,
) -> Response:
    await service.clean_up(
        state_of(request), run_id, who.actor, member_key=member_key or None, again=again, confirm=confirm
    )
    return back(f"/runs/{run_id}/ledger" + (f"?member={member_key}" if member_key else ""))

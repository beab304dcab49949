"""The world across runs: the catalogue of actions, the leases in force, the
workers and the audit log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from roadie.definitions.catalogue import catalogue
from roadie.states import (
    WorkerState,
)
from roadie.views import Lease
from roadie.web.auth import state_of
from roadie.web.dashboard.pages import Viewer, render

router = APIRouter(include_in_schema=False)


@router.get("/catalogue", response_class=HTMLResponse)
async def catalogue_page(request: Request, who: Viewer) -> Response:
    return render(request, "catalogue.html", who, modules=catalogue(state_of(request).registry))


@router.get("/leases", response_class=HTMLResponse)
async def leases_page(request: Request, who: Viewer) -> Response:
    state = state_of(request)
    rows = [Lease.of(r).model_dump() for r in await state.store.leases_in_force()]
    return render(request, "leases.html", who, leases=rows, now=state.clock.now())


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, who: Viewer) -> Response:
    state = state_of(request)
    rows = await state.store.list_workers(state.clock.now(), state.engine.options.claim_ttl)
    return render(request, "workers.html", who, workers=rows)


@router.get("/workers/warning", response_class=HTMLResponse)
async def workers_warning(request: Request, who: Viewer) -> Response:
    """What every page shows under its header, and fetches again now and then: a warning
    while no worker is alive (runs would wait at `pending`, and nothing be cleaned up)."""
    state = state_of(request)
    alive = any(
        w.state == WorkerState.ALIVE
        for w in await state.store.list_workers(state.clock.now(), state.engine.options.claim_ttl)
    )
    return render(request, "_workers_warning.html", who, alive=alive)


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(
    request: Request,
    who: Viewer,
    actor: Annotated[str, Query(max_length=200)] = "",
    action: Annotated[str, Query(max_length=100)] = "",
    run: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> Response:
    """The audit log, newest first, a page of 100, narrowed by who, what (`run` takes every
    run action) and which run."""
    size = 100
    rows = await state_of(request).store.list_audit(
        f"run:{run}" if run else None,
        size + 1,  # one more than shown: whether there is a next page
        actor=actor or None,
        action=action or None,
        offset=(page - 1) * size,
    )
    query = {k: v for k, v in (("actor", actor), ("action", action), ("run", run)) if v}
    return render(request, "audit.html", who, rows=rows[:size], more=len(rows) > size, page=page, query=query, run=run)

"""The live streams the dashboard's pages follow (server-sent events): a list page's
`change` notices, read from what the page shows, so they follow every worker on any
machine. (A run's own stream is the API's, /api/v1/runs/N/events.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from roadie.web.auth import Principal, require, state_of
from roadie.web.live import ANY_RUN, watch_events
from roadie.web.state import WebState
from roadie.web.tokens import Role

router = APIRouter(include_in_schema=False)
Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def watch_stream(state: WebState, what: str, run: int | None) -> AsyncIterator[str]:
    """The `change` stream of one list (`runs`, `ledger` of `run`, `leases`, `workers`);
    a ledger of no such run is refused (404) before the stream starts."""
    store, clock, ttl = state.store, state.clock, state.engine.options.claim_ttl

    async def runs() -> Any:
        return [(r.id, r.status, r.cleanup_status, r.phase) for r in await store.list_runs(limit=200)]

    async def ledger() -> Any:
        assert run is not None
        found = await store.get_run(run)
        return found.cleanup_status, [(r.id, r.state) for r in await store.list_resources(run)]

    async def leases() -> Any:
        return [(r.id, r.state, r.until) for r in await store.leases_in_force()]

    async def workers() -> Any:
        return [(w.worker_id, w.state, w.steps, w.cleanups) for w in await store.list_workers(clock.now(), ttl)]

    looks = {"runs": runs, "ledger": ledger, "leases": leases, "workers": workers}
    if what == "ledger":
        if run is None:
            raise HTTPException(422, "watching a ledger needs ?run=N")
        await store.get_run(run)  # 404 for no such run, before the stream starts
    return watch_events(looks[what], state.broker, poll=state.options.poll, run_id=run or ANY_RUN)


@router.get("/live/watch")
async def watch(
    request: Request,
    who: Viewer,
    what: Annotated[str, Query(pattern="^(runs|ledger|leases|workers)$")],
    run: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> StreamingResponse:
    """Server-sent `change` events for a list page: the page fetches itself again and
    swaps in its table (live.js)."""
    stream = await watch_stream(state_of(request), what, run)
    return StreamingResponse(stream, media_type="text/event-stream", headers=HEADERS)

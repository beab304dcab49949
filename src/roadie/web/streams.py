"""The live streams the dashboard's pages follow (server-sent events): a list page's
`change` notices, read from what the page shows, so they follow every worker on any
machine, and a run's own (the API's, /api/v1/runs/N/events) — each alone, or many as one
(`/live/streams`), which is what the pages use: a browser's tabs share one connection."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from roadie.web.auth import Principal, require, state_of
from roadie.web.live import ANY_RUN, merged, run_events, watch_events
from roadie.web.state import WebState
from roadie.web.tokens import Role

router = APIRouter(include_in_schema=False)
Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_SUBSCRIPTIONS = 64
_SUBSCRIPTION = re.compile(r"^(?:(?P<list>runs|leases|workers)|(?P<of>run|ledger):(?P<id>[1-9][0-9]{0,8}))$")


async def watch_stream(state: WebState, what: str, run: int | None) -> AsyncIterator[str]:
    """The `change` stream of one list (`runs`, `ledger` of `run`, `leases`, `workers`);
    a ledger of no such run is refused (404) before the stream starts."""
    store, clock, ttl = state.store, state.clock, state.engine.options.claim_ttl

    async def runs() -> Any:
        return [(r.id, r.status, r.cleanup_status, r.phase) for r in await store.list_runs(limit=200)]

    async def ledger() -> Any:
        assert run is not None
        # Everything the ledger page draws from the run itself (the clean-up card's words
        # follow its status; the last report, its cleanup's end), beside its rows.
        found = await store.get_run(run)
        said = (found.status, found.cancel_requested, found.cleanup_status, found.cleanup_ended_at)
        return said, [(r.id, r.state) for r in await store.list_resources(run)]

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


@router.get("/live/streams")
async def streams(
    request: Request, who: Viewer, s: Annotated[list[str], Query(description="subscriptions")]
) -> StreamingResponse:
    """Many streams in one connection: `s=run:N` (a run's `run` and `end`), `s=runs`,
    `s=leases`, `s=workers`, `s=ledger:N` (`change`), repeated; each event's data is
    `{"sub": ..., "data": ...}`. live-worker.js keeps one of these for every tab of a
    browser."""
    keys = list(dict.fromkeys(s))
    if not keys or len(keys) > MAX_SUBSCRIPTIONS:
        raise HTTPException(422, f"give 1 to {MAX_SUBSCRIPTIONS} subscriptions (s=runs, s=run:N, s=ledger:N...)")
    state = state_of(request)
    subscribed: dict[str, AsyncIterator[str]] = {}
    for key in keys:
        found = _SUBSCRIPTION.match(key)
        if found is None:
            raise HTTPException(422, f"no such subscription: {key[:40]!r} (runs, leases, workers, run:N, ledger:N)")
        if found["of"] == "run":
            run_id = int(found["id"])
            await state.store.get_run(run_id)  # 404 for no such run, before the stream starts
            subscribed[key] = run_events(state.store, state.broker, run_id, poll=state.options.poll)
        elif found["of"] == "ledger":
            subscribed[key] = await watch_stream(state, "ledger", int(found["id"]))
        else:
            subscribed[key] = await watch_stream(state, found["list"], None)
    down = state.database.down if state.database is not None else None
    return StreamingResponse(merged(subscribed, down), media_type="text/event-stream", headers=HEADERS)

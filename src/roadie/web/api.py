"""The HTTP API, `/api/v1`. Every route names the role it needs; errors are
`{"error": message, "field": ...}` (see `app.py`'s one handler)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from roadie.definitions.catalogue import ModuleEntry, catalogue
from roadie.errors import PreflightRefused
from roadie.states import ResourceState, RunStatus
from roadie.web import schemas, service, tokens
from roadie.web.auth import Principal, require, state_of
from roadie.web.live import run_events
from roadie.web.tokens import Role

router = APIRouter(prefix="/api/v1")
WHY = {
    400: "The body is not JSON, or asks for what cannot be done as asked.",
    401: "No valid token or session.",
    403: "The token's role may not do this.",
    404: "No such run, event, resource or token.",
    409: "What it asks for is not possible now (the run is not in flight; the name is taken; a run to start "
    "would borrow a setting another run holds, or call a module that is offline).",
    413: "The body is over the server's limit (1 MiB by default; 4 MiB for an event file), refused before it is read.",
    422: "The request does not fit: `field` names the first problem, `problems` lists them all.",
    503: "The database is unavailable.",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route may give, besides those every route may (401, 403, 413,
    422, 503): each with the one body the server sends for an error."""
    every = (401, 403, 413, 422, 503)
    return {code: {"model": schemas.ErrorBody, "description": WHY[code]} for code in (*every, *codes)}


ERRORS = _errors()
FOUND = _errors(404)  # names a row that may not exist
CHANGES = _errors(400, 404, 409)  # a body, changing a row whose state may not allow it
Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
# What the routes that read an event file take and may refuse.
EVENT_FILE: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "An event file, YAML or JSON, as the CLI reads it.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}
FILE_ERRORS = {**ERRORS, 422: {"model": schemas.ErrorBody, "description": "The file has mistakes."}}
STORE_ERRORS = {
    **FILE_ERRORS,
    409: {"model": schemas.ErrorBody, "description": "The event moved on from `base_version`."},
}

# Row ids are 32-bit on every database; a larger one names no row, and is refused as such.
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]

# -- pages: every list answers at most `limit` items; when there are more, a `Link` header
# (RFC 8288) gives the URL of the next page, as GitHub's API does.

NEXT = 'When there are more, the URL of the next page: `Link: <url>; rel="next"`.'
Offset = Annotated[int, Query(ge=0, le=10**9, description="Items to skip: the page's start.")]


def page_size(default: int, most: int) -> Any:
    return Query(default, ge=1, le=most, description=f"At most this many (up to {most}). {NEXT}")


def paged(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """`responses` with the 200 answer's `Link` header documented."""
    link = {"Link": {"description": NEXT, "schema": {"type": "string"}}}
    return {**responses, 200: {"description": "A page of the list.", "headers": link}}


def page(request: Request, response: Response, found: list[Any], limit: int, **next_query: Any) -> list[Any]:
    """`found` was read with one item more than `limit`: that one says there is a next page,
    whose URL (`next_query` set on this request's) goes in the `Link` header."""
    if len(found) <= limit:
        return found
    response.headers["Link"] = f'<{request.url.include_query_params(**next_query)}>; rel="next"'
    return found[:limit]


def offset_page(request: Request, response: Response, found: list[Any], limit: int, offset: int) -> list[Any]:
    return page(request, response, found, limit, offset=offset + limit)


def listed_page(request: Request, response: Response, every: list[Any], limit: int, offset: int) -> list[Any]:
    """A page of a list made whole in memory (it is short: leases, schedules, workers)."""
    return offset_page(request, response, every[offset : offset + limit + 1], limit, offset)


@router.get("/me", response_model=schemas.Me, tags=["auth"], responses=ERRORS)
async def me(who: Viewer) -> dict[str, Any]:
    """Who this token is."""
    return {"name": who.actor, "role": who.role.value, "via": who.via}


# -- events -------------------------------------------------------------------------------


@router.get("/events", response_model=list[schemas.Event], tags=["events"], responses=paged(ERRORS))
async def list_events(
    request: Request, response: Response, who: Viewer, limit: int = page_size(100, 1000), offset: Offset = 0
) -> Any:
    """Every event, newest version of each, by id."""
    found = await state_of(request).store.list_events(limit=limit + 1, offset=offset)
    return offset_page(request, response, found, limit, offset)


@router.post(
    "/events",
    response_model=schemas.EventDetail,
    status_code=201,
    tags=["events"],
    responses=STORE_ERRORS,
    openapi_extra=EVENT_FILE,
)
async def upload_event(
    request: Request,
    who: Admin,
    filename: str = Query("event.yaml", max_length=200),
    base_version: int | None = Query(
        None,
        ge=0,
        le=2**31 - 1,
        description="Store only if the event's newest version is still this one (0: the event is new); "
        "else 409. The version its changes were reviewed against (`/events/check` gives them).",
    ),
) -> Any:
    """Validate an event file and store it as the event's newest version (admin). Mistakes
    come back as `file:line: field: message`, one entry each in `problems`."""
    text = await _event_text(request, filename)
    return await service.upload_event(state_of(request), text, filename, who.actor, base=base_version)


@router.post(
    "/events/check",
    response_model=schemas.EventCheck,
    tags=["events"],
    responses=FILE_ERRORS,
    openapi_extra=EVENT_FILE,
)
async def check_event(request: Request, who: Admin, filename: str = Query("event.yaml", max_length=200)) -> Any:
    """Validate an event file as an upload would, and store nothing: what it would become
    (its id, the version storing it would make, what it changes from the newest version),
    or its mistakes as an upload's (422). The site's editor asks this as staff type."""
    text = await _event_text(request, filename)
    return await service.check_event(state_of(request), text, filename)


async def _event_text(request: Request, filename: str) -> str:
    return service.event_text(await request.body(), filename)


@router.get("/events/{event_id}", response_model=schemas.EventDetail, tags=["events"], responses=FOUND)
async def get_event(request: Request, event_id: str, who: Viewer) -> Any:
    """An event's newest version, with its definition and source."""
    return await state_of(request).store.get_event(event_id)


@router.get("/events/{event_id}/versions", response_model=list[schemas.Event], tags=["events"], responses=paged(FOUND))
async def event_versions(
    request: Request,
    response: Response,
    event_id: str,
    who: Viewer,
    limit: int = page_size(100, 1000),
    offset: Offset = 0,
) -> Any:
    """Every stored version of an event, newest first."""
    found = await state_of(request).store.list_event_versions(event_id, limit=limit + 1, offset=offset)
    return offset_page(request, response, found, limit, offset)


# -- runs ---------------------------------------------------------------------------------


@router.get("/runs", response_model=schemas.RunPage, tags=["runs"], responses=ERRORS)
async def list_runs(
    request: Request,
    who: Viewer,
    status: RunStatus | None = None,
    event: str | None = Query(None, max_length=100),
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=1_000_000_000),
) -> Any:
    """Runs, newest first, filtered by state and event, a page at a time."""
    store = state_of(request).store
    status_value = status.value if status else None
    items = await store.list_runs(status=status_value, event_id=event, limit=limit, offset=offset)
    total = await store.count_runs(status=status_value, event_id=event)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@router.post("/runs", response_model=schemas.Run, status_code=201, tags=["runs"], responses=CHANGES)
async def start_run(request: Request, body: schemas.StartRun, who: Operator) -> Any:
    """Start a run of an event with parameters (operator). Every step is rendered and
    validated now, so a bad parameter is refused before anything runs; a run that would
    borrow a setting another run holds, or call a module that is offline, is refused with
    409 naming it, before any step is sent, unless `force` (audited as `run.force`)."""
    state = state_of(request)
    try:
        return await service.start_run(state, body.event, body.params, who.actor, body.version, force=body.force)
    except PreflightRefused as exc:
        raise exc.saying('"force": true') from None


@router.post("/runs/batch", response_model=list[schemas.Run], status_code=201, tags=["runs"], responses=CHANGES)
async def start_runs(request: Request, body: schemas.StartRuns, who: Operator) -> Any:
    """Start many runs of one event, one per entry of `runs`, in one transaction (operator).
    Every run is rendered and validated first: one bad parameter refuses them all, and
    the error names its entry (`runs[3].params`). Pre-flight refuses them all (409) when
    any would borrow a setting another run holds, unless `force`."""
    params = [entry.params for entry in body.runs]
    state = state_of(request)
    try:
        return await service.start_runs(state, body.event, params, who.actor, body.version, force=body.force)
    except PreflightRefused as exc:
        raise exc.saying('"force": true') from None


@router.get("/runs/{run_id}", response_model=schemas.Run, tags=["runs"], responses=FOUND)
async def get_run(request: Request, run_id: RowId, who: Viewer) -> Any:
    return await state_of(request).store.get_run(run_id)


@router.post(
    "/runs/{run_id}/cancel", response_model=schemas.CancelAnswer, status_code=202, tags=["runs"], responses=CHANGES
)
async def cancel_run(request: Request, run_id: RowId, who: Operator) -> Any:
    """Cancel a run (operator): no new dispatches; in-flight steps answer; then cleanup per
    the event's policy. 409 when the run is not in flight."""
    await service.cancel_run(state_of(request), run_id, who.actor)
    return {"run_id": run_id, "cancel_requested": True}


@router.get("/runs/{run_id}/steps", response_model=list[schemas.Step], tags=["runs"], responses=paged(FOUND))
async def run_steps(
    request: Request,
    response: Response,
    run_id: RowId,
    who: Viewer,
    limit: int = page_size(1000, 10_000),
    offset: Offset = 0,
) -> Any:
    """A run's steps in order, with their attempts."""
    store = state_of(request).store
    await store.get_run(run_id)
    found = await store.list_steps(run_id, limit=limit + 1, offset=offset)
    return offset_page(request, response, found, limit, offset)


@router.get("/runs/{run_id}/ledger", response_model=list[schemas.Resource], tags=["ledger"], responses=paged(FOUND))
async def run_ledger(
    request: Request,
    response: Response,
    run_id: RowId,
    who: Viewer,
    state: ResourceState | None = None,
    limit: int = page_size(1000, 10_000),
    after: int = Query(0, ge=0, le=2**31 - 1, description="Only rows with a greater id: the page's start."),
) -> Any:
    """A run's ledger: every resource it recorded, in the order recorded, with its state.
    Paged by id (`after`), so rows recorded meanwhile neither shift nor repeat a page."""
    store = state_of(request).store
    await store.get_run(run_id)
    found = await store.list_resources(run_id, state=state, after=after, limit=limit + 1)
    return page(request, response, found, limit, after=found[limit - 1].id if len(found) > limit else after)


@router.get(
    "/runs/{run_id}/events",
    tags=["runs"],
    responses={**FOUND, 200: {"content": {"text/event-stream": {}}, "description": "Server-sent events."}},
    response_class=StreamingResponse,
)
async def run_stream(request: Request, run_id: RowId, who: Viewer) -> StreamingResponse:
    """Live updates of a run as server-sent events: `run` whenever its state or a step's
    changes (the first with every step's status and attempts, each later one with only the
    steps that changed), then `end` once it has ended and any automatic cleanup is done."""
    state = state_of(request)
    await state.store.get_run(run_id)
    stream = run_events(state.store, state.broker, run_id, poll=state.options.poll)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


# -- cleanup ------------------------------------------------------------------------------


@router.get("/runs/{run_id}/cleanup/plan", response_model=list[schemas.PlannedCall], tags=["cleanup"], responses=FOUND)
async def cleanup_plan(
    request: Request, run_id: RowId, who: Viewer, member_key: str | None = Query(None, max_length=190)
) -> Any:
    """What cleanup would call, in order, without calling anything."""
    return service.plan_dicts(await service.plan(state_of(request), run_id, member_key))


@router.get(
    "/runs/{run_id}/cleanup/preview", response_model=list[schemas.PreviewGroup], tags=["cleanup"], responses=FOUND
)
async def cleanup_preview(
    request: Request, run_id: RowId, who: Viewer, member_key: str | None = Query(None, max_length=190)
) -> Any:
    """What cleanup would take down, by module and kind, with the newest few of each in
    the world's words, and whether a module's cap would hold the cleanup for a confirm."""
    return [asdict(g) for g in await state_of(request).engine.cleanup.preview(run_id, member_key)]


@router.post("/runs/{run_id}/cleanup", response_model=schemas.CleanupReport, tags=["cleanup"], responses=CHANGES)
async def cleanup(request: Request, run_id: RowId, who: Operator, body: schemas.StartCleanup | None = None) -> Any:
    """Clean up a run now and report (operator): revert every live resource newest first.
    After `incomplete` this is the retry; `member_key` scopes it to one participant;
    `confirm` goes ahead past a module's cap."""
    body = body or schemas.StartCleanup()
    report = await service.clean_up(
        state_of(request), run_id, who.actor, member_key=body.member_key, again=body.again, confirm=body.confirm
    )
    return report.as_dict()


@router.post("/resources/{resource_id}/forget", response_model=schemas.Resource, tags=["cleanup"], responses=CHANGES)
async def forget(request: Request, resource_id: RowId, body: schemas.Forget, who: Admin) -> Any:
    """Give up on a resource that can never be reverted (admin); audited with the reason."""
    state = state_of(request)
    await state.engine.cleanup.forget(resource_id, actor=who.actor, reason=body.reason)
    return await state.store.get_resource(resource_id)


# -- the world ----------------------------------------------------------------------------


@router.get("/leases", response_model=list[schemas.Lease], tags=["leases"], responses=paged(ERRORS))
async def leases(
    request: Request, response: Response, who: Viewer, limit: int = page_size(1000, 10_000), offset: Offset = 0
) -> Any:
    """Leases in force: which run holds which target, until when (none: until cleanup)."""
    found = [schemas.Lease.of(r) for r in await state_of(request).store.leases_in_force()]
    return listed_page(request, response, found, limit, offset)


@router.get("/catalogue", response_model=list[ModuleEntry], tags=["catalogue"], responses=ERRORS)
async def catalogue_of_modules(request: Request, who: Viewer) -> Any:
    """What the loaded modules offer an event's author: each action's parameters (its
    JSON Schema), reversible class and an example step; each lease and how it is borrowed."""
    return catalogue(state_of(request).registry)


@router.get("/schedules", response_model=list[schemas.Schedule], tags=["schedules"], responses=paged(ERRORS))
async def list_schedules(
    request: Request, response: Response, who: Viewer, limit: int = page_size(100, 1000), offset: Offset = 0
) -> Any:
    """Scheduled events, where each schedule stands and its next occurrence. A schedule is
    changed by uploading a new version of its event (admin)."""
    found = await service.schedule_views(state_of(request))
    return listed_page(request, response, found, limit, offset)


@router.get("/workers", response_model=list[schemas.Worker], tags=["workers"], responses=paged(ERRORS))
async def list_workers(
    request: Request, response: Response, who: Viewer, limit: int = page_size(100, 1000), offset: Offset = 0
) -> Any:
    """Workers that have run against this database: alive, stopped or gone quiet."""
    state = state_of(request)
    found = await state.store.list_workers(state.clock.now(), state.engine.options.claim_ttl)
    return listed_page(request, response, found, limit, offset)


@router.get("/audit", response_model=list[schemas.AuditEntry], tags=["audit"], responses=paged(ERRORS))
async def audit(
    request: Request,
    response: Response,
    who: Viewer,
    run: int | None = Query(None, ge=1, le=2**31 - 1),
    subject: str | None = Query(None, max_length=200),
    actor: str | None = Query(None, max_length=200),
    action: str | None = Query(None, max_length=100, description="`run.start`, or `run` for every run action"),
    since: datetime | None = Query(None, description="at or after this time (ISO 8601)"),
    until: datetime | None = Query(None, description="before this time (ISO 8601)"),
    limit: int = page_size(100, 1000),
    offset: Offset = 0,
) -> Any:
    """The audit log, newest first: who did what, those entries matching every filter
    given. `run` is shorthand for `subject=run:N`; `offset` pages through the rest. A
    time without a zone is UTC."""
    since, until = (t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t for t in (since, until))
    found = await state_of(request).store.list_audit(
        f"run:{run}" if run else subject, limit + 1, actor=actor, action=action, since=since, until=until, offset=offset
    )
    return offset_page(request, response, found, limit, offset)


# -- tokens -------------------------------------------------------------------------------


@router.get("/tokens", response_model=list[schemas.Token], tags=["auth"], responses=paged(ERRORS))
async def list_tokens(
    request: Request, response: Response, who: Admin, limit: int = page_size(100, 1000), offset: Offset = 0
) -> Any:
    """Every token, revoked ones too (admin). Secrets are never shown again."""
    found = await state_of(request).store.list_tokens(limit=limit + 1, offset=offset)
    return offset_page(request, response, found, limit, offset)


@router.post("/tokens", response_model=schemas.MintedToken, status_code=201, tags=["auth"], responses=_errors(400, 409))
async def create_token(request: Request, body: schemas.NewToken, who: Admin) -> Any:
    """Mint a token (admin). The answer carries the token once; only its hash is kept."""
    state = state_of(request)
    minted = tokens.mint()
    row = await state.store.create_token(
        key=minted.key,
        name=body.name,
        role=body.role.value,
        secret_hash=minted.secret_hash,
        actor=who.actor,
        now=state.clock.now(),
    )
    return {**asdict(row), "token": minted.token}


@router.delete("/tokens/{token}", response_model=schemas.Token, tags=["auth"], responses=_errors(404, 409))
async def revoke_token(request: Request, token: str, who: Admin) -> Any:
    """Revoke a token by name, key or id (admin); its dashboard sessions end at once."""
    state = state_of(request)
    revoked = await state.store.revoke_token(token, who.actor, state.clock.now())
    state.forget_credentials()  # at once here; another server process trusts it for credentials_ttl at most
    return revoked

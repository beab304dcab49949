"""The runs, the event definitions (upload, the editor, an event's page) and
starting a run from a form."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, Response

from roadie.definitions import EventDefinition
from roadie.definitions.catalogue import LEASE_ACTION, catalogue, schema_of
from roadie.definitions.schema import event_schema
from roadie.errors import DefinitionError, InvalidState, PreflightRefused, Problem, RoadieError
from roadie.states import (
    RunStatus,
)
from roadie.web import service
from roadie.web.auth import Principal, state_of
from roadie.web.dashboard.pages import Admin, Operator, Viewer, back, render

router = APIRouter(include_in_schema=False)

STATES = [s.value for s in RunStatus]
Version = Annotated[int | None, Query(ge=1, le=2**31 - 1)]


@router.get("/", response_class=HTMLResponse)
async def runs_page(
    request: Request, who: Viewer, status: str | None = None, event: str | None = None, page: int = 1
) -> Response:
    store = state_of(request).store
    status = status if status in STATES else None
    page = max(1, min(page, 1_000_000))
    size = 50
    runs = await store.list_runs(status=status, event_id=event or None, limit=size, offset=(page - 1) * size)
    total = await store.count_runs(status=status, event_id=event or None)
    events = await store.list_events()
    return render(
        request,
        "runs.html",
        who,
        runs=runs,
        events=events,
        states=STATES,
        status=status,
        event=event,
        page=page,
        pages=max(1, -(-total // size)),
        total=total,
        upload_errors=None,
        upload_source="",
        upload_checked=None,
    )


@router.post("/events", response_class=HTMLResponse)
async def upload_event(
    request: Request,
    who: Admin,
    source: Annotated[str, Form(max_length=service.MAX_EVENT_BYTES)] = "",
    filename: Annotated[str, Form(max_length=200)] = "event.yaml",
    file: Annotated[UploadFile | None, File()] = None,
    check: Annotated[str, Form(max_length=10)] = "",
    editor: Annotated[str, Form(max_length=10)] = "",
    base: Annotated[int | None, Form(ge=0, le=2**31 - 1)] = None,
) -> Response:
    """Store an event file, chosen (`file`) or pasted (`source`); with `check`, only say
    whether it is valid and which version it would become, storing nothing. From the
    editor (`editor`), a refusal comes back in the editor, with the text as typed; `base`
    is the version whose changes were shown (see `service.upload_event`)."""
    state = state_of(request)
    if editor:
        try:
            stored = await service.upload_event(state, source, filename or "event.yaml", who.actor, base=base)
        except (DefinitionError, InvalidState) as exc:
            problems = exc.problems if isinstance(exc, DefinitionError) else [Problem(filename, None, "", exc.message)]
            code = 422 if isinstance(exc, DefinitionError) else 409
            shown = filename.removesuffix(".yaml") if base else ""
            return _editor(request, who, source, filename, base, event_id=shown, problems=problems, status_code=code)
        return back(f"/events/{stored.event_id}?stored={stored.version}")
    try:
        if file is not None and file.filename:
            filename = file.filename
            source = service.event_text(await file.read(service.MAX_EVENT_BYTES + 1), filename)
        if not source.strip():
            return await _runs_refused(request, who, upload_errors=["choose an event file, or paste its text"])
        if check:
            checked = await service.check_event(state, source, filename or "event.yaml")
            return await _runs_refused(
                request, who, upload_source=source, upload_checked=checked.message, status_code=200
            )
        stored = await service.upload_event(state, source, filename or "event.yaml", who.actor)
    except DefinitionError as exc:
        return await _runs_refused(request, who, upload_errors=[str(p) for p in exc.problems], upload_source=source)
    return back(f"/events/{stored.event_id}?stored={stored.version}")


@router.get("/editor", response_class=HTMLResponse)
async def editor_page(
    request: Request, who: Admin, event: Annotated[str, Query(max_length=100, pattern="^[a-z0-9_.-]*$")] = ""
) -> Response:
    """The event editor: an event's newest file (`?event=ID`) or a new one, checked by the
    server as it is typed (`POST /api/v1/events/check`), with completion from the
    catalogue; saving an event that exists shows what changes first."""
    if not event:
        return _editor(request, who, NEW_EVENT, "event.yaml", 0)
    row = await state_of(request).store.get_event(event)
    return _editor(request, who, row.source, f"{event}.yaml", row.version, event_id=event)


NEW_EVENT = """\
# yaml-language-server: $schema=/schema/event.json
id: my-event
title: My event
params:
  region: {type: str, default: britain}
phases:
  - name: first
    steps:
      - action: core.log
        with: {message: "{{ event.title }} begins in {{ region }}"}
"""


def _editor(
    request: Request,
    who: Principal,
    source: str,
    filename: str,
    base: int | None,
    *,
    event_id: str = "",
    problems: list[Problem] | None = None,
    status_code: int = 200,
) -> Response:
    """The editor page with `source` in it; `base` is the version it was opened from."""
    registry = state_of(request).registry
    lease = registry.action(LEASE_ACTION)
    data = {
        "modules": [m.as_dict() for m in catalogue(registry)],
        "lease_action": {"id": lease.id, "description": lease.description, "schema": schema_of(lease)},
        "event_schema": event_schema(),
    }
    return render(
        request,
        "editor.html",
        who,
        status_code=status_code,
        source=source,
        filename=filename,
        base=base,
        event_id=event_id,
        problems=problems or [],
        editor_data=data,
    )


@router.get("/events", response_class=HTMLResponse)
async def events_page(request: Request, who: Viewer) -> Response:
    state = state_of(request)
    scheduled = {s["event_id"]: s for s in await service.schedule_views(state)}
    return render(request, "events.html", who, events=await state.store.list_events(), scheduled=scheduled)


@router.get("/events/{event_id}", response_class=HTMLResponse)
async def event_page(
    request: Request, event_id: str, who: Viewer, version: Version = None, stored: Version = None
) -> Response:
    return await _event_page(request, who, event_id, version=version, stored=stored)


async def _event_page(
    request: Request,
    who: Principal,
    event_id: str,
    *,
    version: int | None = None,
    stored: int | None = None,
    typed: dict[str, str] | None = None,
    problems: dict[str, str] | None = None,
    start_error: str | None = None,
    preview: dict[str, Any] | None = None,
    refused: bool = False,
) -> Response:
    """An event's page: its versions, the source of one, and (for its newest version) a
    start form with a field per param; refused, the form comes back with what was typed
    and every problem beside its field. Refused by pre-flight (`refused`, 409), it also
    offers to start anyway, which is audited."""
    state = state_of(request)
    versions = await state.store.list_event_versions(event_id)
    shown = next((v for v in versions if v.version == version), versions[0])
    earlier = next((v for v in versions if v.version < shown.version), None)
    changes = (
        service.source_changes(earlier.source, shown.source, f"v{earlier.version}", f"v{shown.version}")
        if earlier is not None
        else []
    )
    scheduled = {s["event_id"]: s for s in await service.schedule_views(state)}.get(event_id)
    specs = EventDefinition.model_validate(shown.definition).params
    return render(
        request,
        "event.html",
        who,
        status_code=409 if refused else 422 if problems or start_error else 200,
        versions=versions,
        earlier=earlier,
        changes=changes,
        shown=shown,
        stored=stored,
        scheduled=scheduled,
        specs=specs,
        typed=typed or {},
        problems=problems or {},
        start_error=start_error,
        preview=preview,
        refused=refused,
    )


@router.post("/events/{event_id}/runs", response_class=HTMLResponse)
async def start_from_form(request: Request, event_id: str, who: Operator) -> Response:
    """Start a run of the event's newest version from its form: one field per param, an
    empty field taking the param's default. Every param is checked before anything
    starts, and all that are wrong are said at once. A run that pre-flight finds bound to
    fail (a setting another run holds) is refused beside the form, which then offers the
    box that starts it anyway (`force`, audited)."""
    state = state_of(request)
    event = await state.store.get_event(event_id)
    specs = EventDefinition.model_validate(event.definition).params
    form = await request.form()
    typed = {name: str(form.get(f"param.{name}", "")).strip() for name in specs}
    params: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for name, spec in specs.items():
        if typed[name] == "":
            if spec.required and spec.default is None:
                problems[name] = "required"
            continue
        try:
            params[name] = spec.coerce(name, typed[name])
        except ValueError as exc:
            problems[name] = str(exc)
    if problems:
        return await _event_page(request, who, event_id, typed=typed, problems=problems)
    try:
        if form.get("preview"):
            preview = await service.preview_run(state, event, params)
            return await _event_page(request, who, event_id, typed=typed, preview=preview)
        force = form.get("force") == "true"
        run = await service.start_run(state, event_id, params, who.actor, event.version, force=force)
    except PreflightRefused as exc:
        message = exc.saying("Ticking the box below").message
        return await _event_page(request, who, event_id, typed=typed, start_error=message, refused=True)
    except RoadieError as exc:
        return await _event_page(request, who, event_id, typed=typed, start_error=exc.message)
    return back(f"/runs/{run.id}")


async def _runs_refused(
    request: Request,
    who: Principal,
    *,
    upload_errors: list[str] | None = None,
    upload_source: str = "",
    upload_checked: str | None = None,
    status_code: int = 422,
) -> Response:
    """The runs page again, 422, with why an upload was refused and what was typed kept in
    its form (200 with what a check found)."""
    state = state_of(request)
    events = await state.store.list_events()
    runs = await state.store.list_runs(limit=50)
    return render(
        request,
        "runs.html",
        who,
        status_code=status_code,
        runs=runs,
        events=events,
        states=STATES,
        status=None,
        event=None,
        page=1,
        pages=1,
        total=len(runs),
        upload_errors=upload_errors,
        upload_source=upload_source,
        upload_checked=upload_checked,
    )


@router.get("/start")
async def start_chooser(
    request: Request, who: Operator, event: Annotated[str, Query(max_length=100, pattern="^[a-z0-9_.-]+$")]
) -> Response:
    """The Runs page's "Start a run": on to the chosen event's own start form, which has a
    field per param, the preview and pre-flight (the page's one way to start a run)."""
    return back(f"/events/{event}#start")

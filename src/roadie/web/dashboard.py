"""The staff dashboard: server-rendered pages (Jinja2) with htmx for live parts.

Pages read through the same store methods as the API, and act through `service`, so a
button does exactly what the matching API call and CLI command do. Forms post with the
session's CSRF token; after a form the browser is redirected (POST, redirect, GET).
"""

from __future__ import annotations

import functools
import hmac
import json
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from roadie.definitions import EventDefinition
from roadie.definitions.catalogue import LEASE_ACTION, catalogue, schema_of
from roadie.definitions.schema import event_schema
from roadie.engine.cleanup import describe
from roadie.errors import DefinitionError, InvalidState, PreflightRefused, Problem, RoadieError
from roadie.states import (
    CLEANUP_DUE,
    LAYER_KIND,
    STEP_KIND,
    ResourceState,
    RunStatus,
    StepStatus,
    WorkerState,
)
from roadie.store.rows import ResourceRow, RunRow, StepRow
from roadie.views import Lease
from roadie.web import auth, paging, service
from roadie.web.api import RowId
from roadie.web.auth import COOKIE, Principal, require, state_of
from roadie.web.timeline import draw, layout
from roadie.web.tokens import Role

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.auto_reload = False  # the files never change under a running server: no stat per render


def _world_words(row: ResourceRow) -> str:
    """A ledger row as staff would say it (a step's placeholder by what became of it)."""
    if row.kind == STEP_KIND:
        if row.state == ResourceState.RESOLVED.value:
            return "its step answered: what it made is listed on its own rows"
        if row.state == ResourceState.PENDING.value:
            return "whatever its step's key made (no answer has come)"
    return describe(row.kind, row.ref, row.payload)


templates.env.filters["world_words"] = _world_words


def _kind_words(row: ResourceRow, steps: dict[int, StepRow]) -> str | None:
    """A row of Roadie's own kinds in words: a step's placeholder by its step's name and
    phase, a layer of a lease that stacks by its lease and priority. None for a module's
    kind, which is already its world's word (`creature`)."""
    if row.kind == STEP_KIND:
        step = steps.get(row.step_id) if row.step_id is not None else None
        return f"placeholder for step {step.name!r} (phase {step.phase + 1})" if step else "placeholder for a step"
    if row.kind == LAYER_KIND:
        payload = row.payload if isinstance(row.payload, dict) else {}
        return f"layer of {payload.get('lease', 'a lease')}, priority {payload.get('priority')}"
    return None


templates.env.globals["kind_words"] = _kind_words


def _detail_value(value: Any) -> str:
    """One value of an audit entry's detail as text: a string as it is, else as JSON. The
    template escapes it, so that what a caller wrote (an event's param) stays text."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


templates.env.filters["detail_value"] = _detail_value


@functools.lru_cache(maxsize=256)
def _state(value: str) -> Markup:
    """A state's badge. A function rather than a Jinja macro: a run page draws one per
    step, and a macro call costs several times a function's. There are few states, so
    each badge is made once."""
    return Markup('<span class="state s-{}">{}</span>').format(value, str(value).replace("_", " "))


templates.env.globals["state"] = _state
templates.env.globals["draw_timeline"] = draw
templates.env.globals["Filter"] = paging.Filter


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
        {"owner": owner, "kind": kind, "count": len(rows), "newest": [_world_words(r) for r in rows[:newest]]}
        for (owner, kind), rows in groups.items()
    ]
    return {"groups": shown, "counts": counts}


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
STATES = [s.value for s in RunStatus]
Version = Annotated[int | None, Query(ge=1, le=2**31 - 1)]


def _shown(
    state: Annotated[str, Query(max_length=20, pattern="^[a-z_]*$")] = "",
    action: Annotated[str, Query(max_length=100)] = "",
    phase: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> paging.Filter:
    """Which of a run's steps or ledger rows a page shows: `?state=failed&phase=2&page=3`."""
    return paging.Filter(state, action, phase, page)


Shown = Annotated[paging.Filter, Depends(_shown)]


def _page_context(who: Principal | None, context: dict[str, Any]) -> dict[str, Any]:
    context.update(auth.template_globals(who))
    context["can_operate"] = who is not None and who.role.allows(Role.OPERATOR)
    context["is_admin"] = who is not None and who.role.allows(Role.ADMIN)
    return context


def _render(request: Request, name: str, who: Principal | None, status_code: int = 200, **context: Any) -> Response:
    return templates.TemplateResponse(request, name, _page_context(who, context), status_code=status_code)


def _render_text(request: Request, name: str, who: Principal | None, **context: Any) -> str:
    """A page, or a part of one, as text: for a caller that keeps it or sends it alone."""
    return templates.get_template(name).render(_page_context(who, {**context, "request": request}))


def error_page(request: Request, code: int, message: str) -> Response:
    who = getattr(request.state, "principal", None)
    return _render(request, "error.html", who, status_code=code, code=code, message=message)


def _back(url: str) -> Response:
    return RedirectResponse(url, status_code=303)


# -- signing in ---------------------------------------------------------------------------


LOGIN_CSRF = "roadie_login_csrf"


def local_path(target: str) -> str | None:
    """`target` when it is a path on this site (`/runs/5/ledger?member=a`), else None.

    Where signing in goes next comes from the address, which anyone can write: taken
    as it is, a link to this site's sign-in page could send staff on to another site
    that looks like it (an open redirect). So only a path is taken: no scheme, no host,
    not `//host` nor `/\\host` (which browsers read as `//host`), and no control
    character or space (browsers drop a tab or newline, turning `/<tab>/host` into `//host`)."""
    if len(target) > 2000 or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in target):
        return None
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else None


def login_address(request: Request) -> str:
    """The sign-in page, saying to come back to the page asked for (a GET's own address)."""
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    back = local_path(here) if request.method == "GET" and here != "/" else None
    return "/login" + (f"?{urlencode({'next': back})}" if back else "")


def _login_form(request: Request, status_code: int = 200, error: str | None = None, then: str = "") -> Response:
    """The sign-in page, with a fresh token for its form in a cookie of its own (double
    submit): a page on another site cannot sign a browser in under the attacker's token.
    `then` is where signing in goes next (a local path, else nowhere but the runs)."""
    token = secrets.token_urlsafe(24)
    then = local_path(then) or ""
    response = _render(request, "login.html", None, status_code=status_code, error=error, login_csrf=token, then=then)
    response.set_cookie(
        LOGIN_CSRF,
        token,
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=state_of(request).options.secure_cookies,
    )
    return response


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, then: Annotated[str, Query(alias="next", max_length=2000)] = "") -> Response:
    return _login_form(request, then=then)


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=400)],
    csrf: Annotated[str, Form(max_length=100)] = "",
    then: Annotated[str, Form(alias="next", max_length=2000)] = "",
) -> Response:
    """Sign in with an API token; the session then carries its role. Then on to `next`,
    the page asked for before signing in, when it is a path on this site; else the runs."""
    expected = request.cookies.get(LOGIN_CSRF, "")
    if not expected or not hmac.compare_digest(csrf.encode(), expected.encode()):
        return _login_form(
            request, 403, "This sign-in form has expired or came from elsewhere; sign in again.", then=then
        )
    state = state_of(request)
    row = await auth.check_token(state, token)
    if row is None:
        return _login_form(request, 401, "That token is not valid.", then=then)
    cookie = await auth.open_session(state, row)
    response = _back(local_path(then) or "/")
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(state.options.session_ttl),
        httponly=True,
        samesite="lax",
        secure=state.options.secure_cookies,
    )
    response.delete_cookie(LOGIN_CSRF)
    return response


@router.post("/logout")
async def logout(request: Request, who: Viewer) -> Response:
    cookie = request.cookies.get(COOKIE)
    if cookie:
        await auth.close_session(state_of(request), cookie, who.actor)
    response = _back("/login")
    response.delete_cookie(COOKIE)
    return response


# -- runs ---------------------------------------------------------------------------------


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
    return _render(
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
        return _back(f"/events/{stored.event_id}?stored={stored.version}")
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
    return _back(f"/events/{stored.event_id}?stored={stored.version}")


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
    return _render(
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
    return _render(request, "events.html", who, events=await state.store.list_events(), scheduled=scheduled)


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
    return _render(
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
    return _back(f"/runs/{run.id}")


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
    return _render(
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
    return _back(f"/events/{event}#start")


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
        _render_text(
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
    html = _render_text(request, "run.html", who, live=live, f=f, **context) if whole else str(live)
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
    return _render(
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
    return _back(f"/runs/{run_id}")


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
    return _back(f"/runs/{run_id}/ledger" + (f"?member={member_key}" if member_key else ""))


# -- the world ----------------------------------------------------------------------------


@router.get("/catalogue", response_class=HTMLResponse)
async def catalogue_page(request: Request, who: Viewer) -> Response:
    return _render(request, "catalogue.html", who, modules=catalogue(state_of(request).registry))


@router.get("/leases", response_class=HTMLResponse)
async def leases_page(request: Request, who: Viewer) -> Response:
    state = state_of(request)
    rows = [Lease.of(r).model_dump() for r in await state.store.leases_in_force()]
    return _render(request, "leases.html", who, leases=rows, now=state.clock.now())


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, who: Viewer) -> Response:
    state = state_of(request)
    rows = await state.store.list_workers(state.clock.now(), state.engine.options.claim_ttl)
    return _render(request, "workers.html", who, workers=rows)


@router.get("/workers/warning", response_class=HTMLResponse)
async def workers_warning(request: Request, who: Viewer) -> Response:
    """What every page shows under its header, and fetches again now and then: a warning
    while no worker is alive (runs would wait at `pending`, and nothing be cleaned up)."""
    state = state_of(request)
    alive = any(
        w.state == WorkerState.ALIVE
        for w in await state.store.list_workers(state.clock.now(), state.engine.options.claim_ttl)
    )
    return _render(request, "_workers_warning.html", who, alive=alive)


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
    return _render(request, "audit.html", who, rows=rows[:size], more=len(rows) > size, page=page, query=query, run=run)

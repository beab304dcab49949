"""What every page of the dashboard is drawn with: the templates and the
helpers they call, who may see a page (`Viewer`, `Operator`, `Admin`), and rendering."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from roadie.engine.cleanup import describe
from roadie.states import (
    LAYER_KIND,
    STEP_KIND,
    ResourceState,
)
from roadie.store.rows import ResourceRow, StepRow
from roadie.web import auth, paging
from roadie.web.auth import Principal, require
from roadie.web.timeline import draw
from roadie.web.tokens import Role

templates = Jinja2Templates(directory=Path(__file__).parent.parent / "templates")
templates.env.auto_reload = False  # the files never change under a running server: no stat per render


def world_words(row: ResourceRow) -> str:
    """A ledger row as staff would say it (a step's placeholder by what became of it)."""
    if row.kind == STEP_KIND:
        if row.state == ResourceState.RESOLVED.value:
            return "its step answered: what it made is listed on its own rows"
        if row.state == ResourceState.PENDING.value:
            return "whatever its step's key made (no answer has come)"
    return describe(row.kind, row.ref, row.payload)


templates.env.filters["world_words"] = world_words


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


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]


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


def render(request: Request, name: str, who: Principal | None, status_code: int = 200, **context: Any) -> Response:
    return templates.TemplateResponse(request, name, _page_context(who, context), status_code=status_code)


def render_text(request: Request, name: str, who: Principal | None, **context: Any) -> str:
    """A page, or a part of one, as text: for a caller that keeps it or sends it alone."""
    return templates.get_template(name).render(_page_context(who, {**context, "request": request}))


def error_page(request: Request, code: int, message: str) -> Response:
    who = getattr(request.state, "principal", None)
    return render(request, "error.html", who, status_code=code, code=code, message=message)


def back(url: str) -> Response:
    return RedirectResponse(url, status_code=303)

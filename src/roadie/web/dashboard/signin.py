"""Signing in to the dashboard with an API token, and out."""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response

from roadie.web import auth
from roadie.web.auth import COOKIE, state_of
from roadie.web.dashboard.pages import Viewer, back, render

router = APIRouter(include_in_schema=False)


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
    response = render(request, "login.html", None, status_code=status_code, error=error, login_csrf=token, then=then)
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
    response = back(local_path(then) or "/")
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
    response = back("/login")
    response.delete_cookie(COOKIE)
    return response

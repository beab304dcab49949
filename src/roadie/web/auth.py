"""Who is calling, and may they: bearer tokens, dashboard sessions, CSRF, roles.

An API client sends `Authorization: Bearer rd_...`. The dashboard signs in with a token
once and then carries a session cookie (HttpOnly, SameSite=Lax, signed with
itsdangerous) that names a server-side session; every state-changing request made with a
session must carry that session's CSRF token (form field `csrf` or header
`X-CSRF-Token`), because a cookie is sent by the browser on any site's behalf and a
bearer token is not.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import Request
from itsdangerous import BadSignature, URLSafeTimedSerializer

from roadie.errors import RoadieError
from roadie.store.rows import TokenRow
from roadie.web import tokens
from roadie.web.state import WebState
from roadie.web.tokens import Role

COOKIE = "roadie_session"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class Unauthenticated(RoadieError):
    """Sign in: send a valid token (Authorization: Bearer ...) or a session cookie."""


class Forbidden(RoadieError):
    """This token's role may not do this."""


@dataclass(frozen=True)
class Principal:
    """The caller: its token, and how it came (bearer or session)."""

    token: TokenRow
    via: str  # "bearer" | "session"
    csrf: str | None = None

    @property
    def role(self) -> Role:
        return Role(self.token.role)

    @property
    def actor(self) -> str:
        """Who the audit log names."""
        return self.token.name


def state_of(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


def _signer(state: WebState) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(state.options.secret_key, salt="roadie-session")


def _session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


async def check_token(state: WebState, presented: str) -> TokenRow | None:
    """The live token `presented` is, or None. A token found live a moment ago is trusted
    without a read (`WebState.tokens`); one found wrong is read again each time."""
    parts = tokens.split(presented)
    if parts is None:
        return None
    known = tokens.hash_secret(presented)
    row = state.tokens.get(known)
    if row is not None:
        return row
    row = await state.store.find_token(parts[0])
    if row is None or row.revoked_at is not None or not tokens.matches(parts[1], row.secret_hash):
        return None
    state.tokens.put(known, row)
    return row


async def open_session(state: WebState, token: TokenRow) -> str:
    """Open a session for `token`; answers the signed cookie value."""
    session_id = secrets.token_urlsafe(32)
    now = state.clock.now()
    await state.store.create_session(
        id_hash=_session_hash(session_id),
        token=token,
        csrf=secrets.token_urlsafe(24),
        now=now,
        expires_at=now + timedelta(seconds=state.options.session_ttl),
    )
    return _signer(state).dumps(session_id)


async def close_session(state: WebState, cookie: str, actor: str) -> None:
    session_id = _unsign(state, cookie)
    if session_id is not None:
        await state.store.end_session(_session_hash(session_id), actor, state.clock.now())
        state.forget_credentials()


def _unsign(state: WebState, cookie: str) -> str | None:
    try:
        value = _signer(state).loads(cookie, max_age=int(state.options.session_ttl))
    except BadSignature:
        return None
    return value if isinstance(value, str) else None


async def identify(request: Request) -> Principal | None:
    """The caller, from a bearer token or else a session cookie; None when neither is valid."""
    state = state_of(request)
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() == "bearer" and credential:
        row = await check_token(state, credential)
        return Principal(row, "bearer") if row is not None else None
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    # Kept by the hash of the cookie as sent: a cookie checked a moment ago needs neither
    # its signature checked again nor its session read.
    seen = _session_hash(cookie)
    principal: Principal | None = state.sessions.get(seen)
    if principal is not None:
        return principal
    session_id = _unsign(state, cookie)
    if session_id is None:
        return None
    session = await state.store.get_session(_session_hash(session_id), state.clock.now())
    if session is None:
        return None
    principal = Principal(session.token, "session", session.csrf)
    state.sessions.put(seen, principal)
    return principal


async def _check_csrf(request: Request, principal: Principal) -> None:
    if principal.via != "session" or request.method in SAFE_METHODS:
        return
    sent = request.headers.get("x-csrf-token")
    if sent is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form()  # cached by Starlette: the endpoint's Form() fields still read it
        value = form.get("csrf")
        sent = value if isinstance(value, str) else None
    if not sent or principal.csrf is None or not hmac.compare_digest(sent, principal.csrf):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again")


def require(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency: the caller, who must have at least `role` (401 if unknown, 403 if not allowed)."""

    async def dependency(request: Request) -> Principal:
        principal = await identify(request)
        if principal is None:
            raise Unauthenticated()
        request.state.principal = principal  # known, even when refused: the 403 page has its header
        if not principal.role.allows(role):
            raise Forbidden(f"this needs the {role.value} role; token {principal.actor!r} is {principal.role.value}")
        await _check_csrf(request, principal)
        return principal

    dependency.__name__ = f"require_{role.value}"
    return dependency


def template_globals(principal: Principal | None) -> dict[str, Any]:
    return {"principal": principal, "csrf": principal.csrf if principal else ""}

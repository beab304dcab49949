"""Request bodies are bounded before anything reads them.

FastAPI reads a route's body before it solves the route's dependencies, authentication
among them: without a bound, anyone who can reach the port makes the server hold as much
as they send (a 400 MiB chunked `POST /api/v1/runs` with no token grew it by 800 MB
before its 422). `BodyLimit` sits in front of every route: a declared `Content-Length`
over the route's limit is refused before a byte is read, and a body sent without one
(chunked) is counted as it streams and refused as soon as it passes the limit.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised to whoever reads a body past its limit; the middleware answers 413 instead."""


Limit = Callable[[str, str], int | None]
"""The largest body (bytes) a request may send, from its method and path; None: not bounded here."""
Refusal = Callable[[Scope, int], ASGIApp]
"""The 413 answer for a request over `limit`, as an ASGI app."""


class BodyLimit:
    """Refuse a request whose body is over its limit with the answer `refuse` gives.

    When the body passes its limit mid-stream, whatever the app was doing with it is
    abandoned: the read raises `BodyTooLarge`, and the app's own answer (FastAPI turns a
    failed read into a 400) is replaced by the refusal, unless it had already begun.
    The rest of the body is left to the server, which drops it unread.
    """

    def __init__(self, app: ASGIApp, limit: Limit, refuse: Refusal) -> None:
        self.app = app
        self.limit = limit
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope["method"], scope["path"])
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self.refuse(scope, limit)(scope, receive, send)
            return

        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            if over:
                raise BodyTooLarge()
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge()
            return message

        async def answer(message: Message) -> None:
            nonlocal started
            if over and not started:
                return  # the app's answer to a read it could not finish: the refusal goes instead
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, answer)
        except Exception:
            if not over or started:
                raise
        if over and not started:
            await self.refuse(scope, limit)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def size(limit: int) -> str:
    """A limit as an operator reads it: `1 MiB`, `512 KiB`, or bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit:,} bytes"

"""Whether the database can be used, as the website sees it: looked at every second by
a task of its own, so that an outage is noticed even while nobody asks, and said once
when it begins and once when it ends (never as a traceback per request).

Two ways a database goes: a SQLite file deleted or replaced under the server (SQLite
carries on in the deleted file unawares: what is written there is lost, so the site
must stop at once, and does not come back until it is started again on a real file),
and a server that does not answer (PostgreSQL or MariaDB stopped, refusing connections,
or cut off): then writes are refused, and the site comes back by itself when it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from roadie.log import get_logger
from roadie.store import Store

log = get_logger(__name__)

LOOK_EVERY = 1.0
PING_TIMEOUT = 2.0
# A ping that is only slow is a busy host or a busy database, not an outage: that takes
# this many slow looks in a row. One that fails (refused, reset, the file gone) is at once.
SLOW_LOOKS = 3


class Database(StrEnum):
    OK = "ok"
    LOST = "lost"  # the SQLite file this process opened is gone: for good
    UNREACHABLE = "unreachable"  # the server does not answer: for now


@dataclass
class Outage:
    state: Database
    reason: str
    since: float  # time.time()

    @property
    def message(self) -> str:
        if self.state is Database.LOST:
            return (
                f"The database is gone ({self.reason}): nothing can be read or written here. "
                "Restore the file, then restart roadie serve."
            )
        return f"The database does not answer ({self.reason}): changes are refused until it is back."


class DatabaseWatch:
    """The database's state, kept fresh by `run()`; `down()` is None while it is usable."""

    def __init__(self, store: Store, *, every: float = LOOK_EVERY) -> None:
        self.store = store
        self.every = every
        self._outage: Outage | None = None
        self._slow = 0  # slow looks in a row
        self.changed = asyncio.Event()  # set on every change, for the live streams to end

    def down(self) -> Outage | None:
        lost = self.store.file_lost()
        if lost is not None and (self._outage is None or self._outage.state is not Database.LOST):
            self._set(Outage(Database.LOST, lost, time.time()))
        return self._outage

    def failed(self, error: Exception) -> None:
        """A request met the database failing: believe it now, not at the next look."""
        if self._outage is None:
            self._set(Outage(Database.UNREACHABLE, _reason(error), time.time()))

    def as_dict(self) -> dict[str, Any]:
        outage = self.down()
        if outage is None:
            return {"state": Database.OK.value}
        return {"state": outage.state.value, "reason": outage.reason, "since": outage.since}

    async def look(self) -> None:
        if self.down() is not None and self._outage is not None and self._outage.state is Database.LOST:
            return  # a lost file stays lost
        try:
            await asyncio.wait_for(self.store.ping(), PING_TIMEOUT)
        except TimeoutError as exc:
            self._slow += 1
            if self._slow >= SLOW_LOOKS and self._outage is None:
                self._set(Outage(Database.UNREACHABLE, _reason(exc), time.time()))
            return
        except Exception as exc:  # whatever the driver raises, it is the same news
            if self._outage is None:
                self._set(Outage(Database.UNREACHABLE, _reason(exc), time.time()))
            return
        self._slow = 0
        if self._outage is not None:
            self._set(None)

    async def run(self, stop: asyncio.Event) -> None:
        """Look every `every` seconds until `stop` is set. It ends between looks, never
        inside one: a ping cancelled halfway leaves its connection to the garbage collector."""
        while not stop.is_set():
            await self.look()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)

    def _set(self, outage: Outage | None) -> None:
        before, self._outage = self._outage, outage
        if outage is not None:
            log.error("database unavailable: refusing changes", state=outage.state.value, reason=outage.reason)
        elif before is not None:
            log.warning("database back", after=f"{time.time() - before.since:.0f}s")
        self.changed.set()
        self.changed = asyncio.Event()


def _reason(error: Exception) -> str:
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    if isinstance(error, TimeoutError):
        message = f"no answer within {PING_TIMEOUT:g}s"
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return first[:200]


class RefuseWhileDown:
    """While the database cannot be used, every request but `/healthz` and the static files
    is answered at once with 503 and the outage in one line (a page that looks again by
    itself, for a browser), instead of waiting on the driver's timeout to fail with its
    text, or, for a SQLite file deleted under the server, writing where nobody will read.
    Pure ASGI, as the other middleware."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz" or scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return
        web = getattr(scope["app"].state, "web", None)
        watch: DatabaseWatch | None = getattr(web, "database", None)
        outage = watch.down() if watch is not None else None
        if outage is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        headers = {"Retry-After": "5"}
        if not scope["path"].startswith("/api/") and "text/html" in request.headers.get("accept", ""):
            body = OUTAGE_PAGE.render(message=outage.message)
            response: Response = HTMLResponse(body, status_code=503, headers=headers)
        else:
            error = {"error": outage.message, "field": None, "database": watch.as_dict() if watch else None}
            response = JSONResponse(error, status_code=503, headers=headers)
        await response(scope, receive, send)


OUTAGE_PAGE = Environment(autoescape=True).from_string(
    """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Database unavailable · Roadie</title>
  <link rel="stylesheet" href="/static/style.css">
  <script src="/static/outage.js" defer></script>
</head>
<body>
  <header class="top"><a class="brand" href="/">Roadie</a></header>
  <main>
    <h1>503</h1>
    <p class="card banner" role="alert" id="outage">{{ message }}</p>
    <p class="muted">This page loads again by itself once the database answers.</p>
  </main>
</body>
</html>
"""
)

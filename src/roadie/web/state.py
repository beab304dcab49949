"""What the web app holds while it serves: options, the store, the engine, and friends."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from roadie.clock import Clock
from roadie.engine import Engine
from roadie.registry import Registry
from roadie.store import Store
from roadie.store.rows import TokenRow
from roadie.web.live import Broker
from roadie.web.metrics import Metrics
from roadie.web.outage import DatabaseWatch


@dataclass
class WebOptions:
    """How `roadie serve` runs (see `roadie serve --help`)."""

    database_url: str | None = None
    config: str | None = None
    worker: bool = True  # run the engine's worker loop inside the server
    concurrency: int | None = None
    # Signs session cookies. Without one, a random key per process: sessions end when the
    # server restarts, and several servers behind one address need the same key set.
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    session_ttl: float = 12 * 3600.0
    secure_cookies: bool = False  # set the cookie's Secure flag (serve behind HTTPS)
    poll: float = 1.0  # how often a live stream looks at the database without a nudge
    credentials_ttl: float = 2.0  # how long a checked token or session is trusted without a read
    # The largest request body, in bytes: one over it is refused with 413 before any route
    # (or its authentication) reads it. The routes that take an event file allow
    # `max_event_body`: the file (1 MiB at most), with room for a form's other fields.
    max_body: int = 1 << 20
    max_event_body: int = 4 << 20


K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """What was looked up a moment ago (`seconds`), at most `size` entries, the oldest
    dropped first. A web request's credentials are read from the database on every
    request otherwise, one read as costly as the request's own."""

    def __init__(self, seconds: float, size: int = 4096) -> None:
        self.seconds = seconds
        self.size = size
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if time.monotonic() >= entry[0]:
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: K, value: V) -> None:
        if self.seconds <= 0:
            return
        self._entries[key] = (time.monotonic() + self.seconds, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


@dataclass
class WebState:
    options: WebOptions
    store: Store
    registry: Registry
    engine: Engine
    clock: Clock
    metrics: Metrics
    broker: Broker
    worker_task: asyncio.Task[Any] | None = None
    database: DatabaseWatch | None = None  # whether the database can be used (web/outage.py)
    # Credentials checked a moment ago (`WebOptions.credentials_ttl`), by the hash of the
    # token or session cookie: a revocation or a sign-out here empties them at once; another
    # server process sees it within that moment.
    tokens: Recent[str, TokenRow] = field(init=False)
    sessions: Recent[str, Any] = field(init=False)  # of `auth.Principal`, which imports this module
    # The pages of runs that have ended (whole, and their changing part), drawn once, with
    # the rows they were drawn from, undecoded: given again only while a read finds the
    # same rows (dashboard/run.py). Keyed by run, viewer, whether the page is whole, and its filter.
    drawn: Recent[tuple[int, str, str, str, bool, str], tuple[Any, str]] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = Recent(self.options.credentials_ttl)
        self.sessions = Recent(self.options.credentials_ttl)
        self.drawn = Recent(600.0, size=32)

    def forget_credentials(self) -> None:
        """Check every token and session again on its next use (one was revoked or ended)."""
        self.tokens.clear()
        self.sessions.clear()

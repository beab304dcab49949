"""What the web app holds while it serves: options, the store, the engine, and friends."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

from roadie.clock import Clock
from roadie.engine import Engine
from roadie.registry import Registry
from roadie.store import Store
from roadie.web.live import Broker
from roadie.web.metrics import Metrics


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

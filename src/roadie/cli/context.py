"""What every command needs: settings, the store, the registry, an engine; and logging.

The CLI is the only place that configures logging.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog

from roadie.clock import SystemClock
from roadie.config import Settings, load_settings
from roadie.engine import Engine, EngineOptions
from roadie.registry import Registry, build_registry
from roadie.remote import Remotes, attach_remote_modules, refresh_pull_module
from roadie.remote.gateway import Gateway
from roadie.store import Store


def configure_logging(level: str = "warning", *, json: bool = False) -> None:
    processors: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was set up
    (test runners and daemonisers replace it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@dataclass
class Context:
    settings: Settings
    store: Store
    registry: Registry
    engine: Engine
    remotes: Remotes

    def gateway(self) -> Gateway:
        """What remote modules call, over this context's store, queue and secrets; a
        pulling module that announces itself is usable in this process at once."""
        return Gateway(
            self.store,
            self.remotes.queue,
            self.remotes.secrets,
            self.registry,
            on_announce=lambda m: refresh_pull_module(self.registry, self.remotes, m, self.settings.base_dir),
        )


@asynccontextmanager
async def open_context(
    database_url: str | None, config: str | None, *, concurrency: int | None = None, claim_ttl: float | None = None
) -> AsyncIterator[Context]:
    """Open the database (migrating it), load the modules, and build one engine."""
    settings = load_settings(database_url, config)
    clock = SystemClock()
    registry = build_registry(settings.modules, clock=clock, base_dir=settings.base_dir)
    store = await Store.open(settings.database_url)
    try:
        remotes = await attach_remote_modules(registry, settings.modules, store, base_dir=settings.base_dir)
    except BaseException:
        await store.close()
        await registry.close()
        raise
    options = EngineOptions(**{k: v for k, v in settings.engine.items() if k in EngineOptions.__dataclass_fields__})
    if concurrency is not None:
        options.concurrency = concurrency
    if claim_ttl is not None:
        options.claim_ttl = claim_ttl
    engine = Engine(store, registry, clock=clock, options=options)
    try:
        yield Context(settings, store, registry, engine, remotes)
    finally:
        await store.close()
        await registry.close()

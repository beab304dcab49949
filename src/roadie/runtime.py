"""One process's runtime: its settings, store, registry, engine and remote modules; or,
for a command that only reads what is stored, its settings and store alone.

The CLI's commands and the web app both open one; it lives outside both so that neither
surface imports the other.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from roadie.config import Settings, check_engine, load_settings
from roadie.log import get_logger
from roadie.store import dialects
from roadie.store.connector import Connector

log = get_logger(__name__)

# The engine, the registry, the remote modules and the whole store are imported by what
# opens them (`open_context`), not with this module: `open_store` loads none of them.
if TYPE_CHECKING:
    from roadie.engine import Engine, EngineOptions
    from roadie.registry import Registry
    from roadie.remote import Remotes
    from roadie.remote.gateway import Gateway  # a web app: its libraries are the `web` extra's
    from roadie.store import Store


_frozen = False


def freeze_heap() -> None:
    """Leave what a long-running process holds once it has started (its libraries, modules
    and registry, some hundred thousand objects) out of the garbage collector's full
    passes from now on, once per process: they live as long as it does, and a full pass
    walked them all about once every thousand steps drained, 80-160 ms of a drain whose
    main thread spends 340-360 ms. Garbage there is now is collected first."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


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
        from roadie.remote import refresh_pull_module
        from roadie.remote.gateway import Gateway

        return Gateway(
            self.store,
            self.remotes.queue,
            self.remotes.secrets,
            self.registry,
            on_announce=lambda m: refresh_pull_module(self.registry, self.remotes, m, self.settings.base_dir),
        )


@asynccontextmanager
async def open_context(
    database_url: str | None,
    config: str | None,
    *,
    concurrency: int | None = None,
    claim_ttl: float | None = None,
    read_only: bool = False,
    looks: bool = False,
) -> AsyncIterator[Context]:
    """Open the database (migrating it), load the modules, and build one engine.

    `read_only` is for a command that only checks (`event validate`): it creates nothing
    where it is run. The modules are loaded without their setup (no world file is made),
    and a SQLite database that does not exist yet is not made either: an empty one in
    memory stands in for it, which holds no announced module, as the missing file would.
    `looks` is for a command that only reads, but reads the modules or the engine too
    (`run show`, `workers`...): where the SQLite file does not exist (in a folder that
    does) it is the same, and says so; where it does, the modules are set up as for any
    command. A command that reads only what is stored opens `open_store` instead."""
    from roadie.clock import SystemClock
    from roadie.consoles import attach_console_modules
    from roadie.engine import Engine
    from roadie.engine.notify import parse_webhooks
    from roadie.registry import build_registry
    from roadie.remote import attach_remote_modules
    from roadie.store import Store

    settings = load_settings(database_url, config)
    webhooks = parse_webhooks(settings.webhooks, settings.source)
    options = engine_options(settings)
    clock = SystemClock()
    url = settings.database_url
    stand_in = _stand_in(url) if looks else read_only and not dialects.exists(url)
    registry = build_registry(
        settings.modules, clock=clock, base_dir=settings.base_dir, open_states=not (read_only or stand_in)
    )
    attach_console_modules(
        registry, settings.modules, base_dir=settings.base_dir, open_states=not (read_only or stand_in)
    )
    if stand_in:
        url = dialects.IN_MEMORY
    store = await Store.open(url)
    try:
        remotes = await attach_remote_modules(registry, settings.modules, store, base_dir=settings.base_dir)
    except BaseException:
        await store.close()
        await registry.close()
        raise
    if concurrency is not None:
        options.concurrency = concurrency
    if claim_ttl is not None:
        options.claim_ttl = claim_ttl
    engine = Engine(store, registry, clock=clock, options=options, webhooks=webhooks)
    try:
        yield Context(settings, store, registry, engine, remotes)
    finally:
        await engine.close()
        await store.close()
        await registry.close()


Queries = TypeVar("Queries", bound=Connector)


@asynccontextmanager
async def open_store(database_url: str | None, config: str | None, queries: type[Queries]) -> AsyncIterator[Queries]:
    """Open the database (migrating it) and nothing else, for a command that only reads
    what is stored (`run list`, `audit`...): no module is loaded or set up, no remote
    module's server asked for its manifest, no engine built. `queries` is the store's
    queries of the one concern the command reads (`RunQueries` for `run list`), so that
    it imports those and not every query of the store. A SQLite file is read with a
    blocking engine (`roadie.store.blocking`), which spares the command loading the asyncio
    one. Where the SQLite file does not exist (in a folder that does), it is the same as
    `open_context(looks=True)`."""
    url = load_settings(database_url, config).database_url
    store = await queries.open(dialects.IN_MEMORY if _stand_in(url) else url, blocking=True)
    try:
        yield store
    finally:
        await store.close()


def _stand_in(url: str) -> bool:
    """For a command that only looks: whether an empty database in memory stands in for
    `url`, a SQLite file that does not exist yet; it says so."""
    if dialects.exists(url):
        return False
    parsed = dialects.parse_url(url)
    if dialects.missing_folder(parsed) is not None:
        return False  # opening it says which folder is missing: likely a mistyped URL
    log.warning("no database here yet: nothing has been stored in it", file=str(dialects.sqlite_file(parsed)))
    return True


def engine_options(settings: Settings) -> EngineOptions:
    """`[engine]` of roadie.toml as EngineOptions, checked (`roadie.config.check_engine`):
    a cap or a count that is not one would only fail later, at the first cleanup or once
    the worker had registered itself with it."""
    from roadie.engine import EngineOptions

    return EngineOptions(**check_engine(settings.engine, settings.source).model_dump())

"""Remote modules: the protocol, and the engine's side of both transports.

`attach_remote_modules` adds every module `roadie.toml` names by `url` (push) or
`transport = "pull"` to a registry; `Gateway` serves what the modules call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roadie.errors import ConfigError
from roadie.log import get_logger
from roadie.registry import Module, Registry
from roadie.remote import protocol
from roadie.remote.client import RemoteModule, RemoteSettings, is_remote, push_module, read_cached, write_cached
from roadie.remote.queue import PullTransport, WorkQueue
from roadie.store.store import Store

log = get_logger(__name__)


@dataclass
class Remotes:
    """The remote modules of one process: their secrets (for the gateway) and the queue."""

    queue: WorkQueue
    secrets: dict[str, protocol.Secrets] = field(default_factory=dict)
    settings: dict[str, RemoteSettings] = field(default_factory=dict)


async def attach_remote_modules(
    registry: Registry, modules: Mapping[str, Mapping[str, Any]], store: Store, *, base_dir: str = "."
) -> Remotes:
    """Register the configured remote modules. A push module's manifest comes from its
    server (or its cache when the server is down); a pull module's from what it last
    announced, and a pull module never heard from is registered with no actions yet."""
    remotes = Remotes(WorkQueue(store, clock=registry.clock))
    for name, table in modules.items():
        if not is_remote(table) or table.get("enabled", True) is False:
            continue
        settings = RemoteSettings.from_table(name, table)
        remotes.secrets[name] = settings.secret
        remotes.settings[name] = settings
        if settings.transport == "push":
            module = await push_module(settings, base_dir, clock=registry.clock)
        else:
            module = await pull_module(settings, remotes.queue, base_dir)
        registry.register(module, {})
        log.debug("remote module attached", module=name, transport=settings.transport, actions=len(module.actions))
    return remotes


async def pull_module(settings: RemoteSettings, queue: WorkQueue, base_dir: str) -> Module:
    announced = await queue.calls.announced(settings.name)
    if announced is not None:
        manifest = protocol.Manifest.model_validate(announced)
    else:
        manifest = read_cached(base_dir, settings.name) or protocol.Manifest(module=settings.name)
        if not manifest.actions and not manifest.leases:
            log.warning("pull module has not announced itself yet; it has no actions", module=settings.name)
    if manifest.module != settings.name:
        raise ConfigError(f"module {settings.name!r} announced itself as {manifest.module!r}")
    transport = PullTransport(settings.name, queue, deadline=settings.call_timeout)
    return RemoteModule(manifest, transport, clock=queue.clock).build()


def refresh_pull_module(registry: Registry, remotes: Remotes, manifest: protocol.Manifest, base_dir: str) -> None:
    """A pulling module announced itself: its actions are usable in this process now."""
    settings = remotes.settings.get(manifest.module)
    if settings is None or settings.transport != "pull":
        return
    write_cached(base_dir, manifest)
    transport = PullTransport(settings.name, remotes.queue, deadline=settings.call_timeout)
    module = RemoteModule(manifest, transport, clock=remotes.queue.clock).build()
    registry.register(module, {}, replace=True)


__all__ = ["Remotes", "attach_remote_modules", "pull_module", "refresh_pull_module"]

"""The registry: which modules are loaded, their actions and leases, and their state.

Modules are found through the `roadie.modules` entry point group, or named by import
path (`package.module:attribute`) in `roadie.toml`.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from roadie.clock import Clock, SystemClock
from roadie.errors import ConfigError, RegistryError, UnknownAction, UnknownLease
from roadie.log import get_logger
from roadie.registry.module import Action, Lease, Module, ModuleConfig, maybe_await

log = get_logger(__name__)
ENTRY_POINT_GROUP = "roadie.modules"


@dataclass
class Loaded:
    module: Module
    state: Any
    opened: bool = True  # its setup ran (and its close is owed)


class Registry:
    """Actions and leases by id (`module.name`), each with its module's opened state."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self._loaded: dict[str, Loaded] = {}

    def register(
        self,
        module: Module,
        settings: Mapping[str, Any] | None = None,
        *,
        base_dir: str = ".",
        replace: bool = False,
        open_state: bool = True,
    ) -> None:
        """Add a module and open its state now, so a bad setup fails at start, not mid-run.

        `replace` swaps a module already registered under that name (a remote module that
        announced a new manifest). Without `open_state` only what the module declares is
        known (enough to check an event file): its setup, which may create files or
        connect to a world, is not run."""
        if module.name in self._loaded and not replace:
            raise RegistryError(f"module {module.name!r} is registered twice")
        module.check()
        state = None
        if module.setup_fn is not None and open_state:
            state = module.setup_fn(ModuleConfig(settings or {}, self.clock, base_dir))
        self._loaded[module.name] = Loaded(module, state, opened=open_state)

    async def close(self) -> None:
        for loaded in self._loaded.values():
            if loaded.module.close_fn is not None and loaded.opened:
                await maybe_await(loaded.module.close_fn(loaded.state))

    @property
    def modules(self) -> list[Module]:
        return [loaded.module for loaded in self._loaded.values()]

    def state(self, module_name: str) -> Any:
        return self._loaded[module_name].state

    async def offline(self, module_name: str) -> str | None:
        """Why the module cannot reach its world now, by its `online` hook, or None (also
        for a module that declares no hook). A hook that raises is offline, saying what it
        raised."""
        loaded = self._loaded[module_name]
        if loaded.module.online_fn is None:
            return None
        try:
            why = await maybe_await(loaded.module.online_fn(loaded.state))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}".rstrip(": ")
        return None if why is None else str(why)

    def module(self, name: str) -> Module:
        try:
            return self._loaded[name].module
        except KeyError:
            raise RegistryError(f"no module {name!r} is registered") from None

    def action_ids(self) -> list[str]:
        return sorted(a.id for m in self.modules for a in m.actions.values())

    def lease_ids(self) -> list[str]:
        return sorted(lease.id for m in self.modules for lease in m.leases.values())

    def action(self, action_id: str) -> Action:
        module_name, _, name = action_id.partition(".")
        loaded = self._loaded.get(module_name)
        action = loaded.module.actions.get(name) if loaded else None
        if action is None:
            raise UnknownAction(f"unknown action {action_id!r}{_suggest(action_id, self.action_ids())}")
        return action

    def lease(self, lease_id: str) -> Lease:
        module_name, _, name = lease_id.partition(".")
        loaded = self._loaded.get(module_name)
        lease = loaded.module.leases.get(name) if loaded else None
        if lease is None:
            raise UnknownLease(f"unknown lease {lease_id!r}{_suggest(lease_id, self.lease_ids())}")
        return lease

    def lease_for_ref(self, ref: str) -> tuple[Lease, str | None] | None:
        """Parse `lease#target` and find the lease; None when no module registers it."""
        lease_id, sep, target = ref.partition("#")
        try:
            lease = self.lease(lease_id)
        except UnknownLease:
            return None
        if lease.targeted != bool(sep and target):
            return None
        return lease, (target if sep else None)


def _suggest(wrong: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(wrong, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def import_module_object(path: str, *, beside: str | None = None) -> Module:
    """Import `package.module:attribute` (or `package.module`, attribute `module`); with
    `beside`, a module file in that folder (the configuration's) is found there too, as
    an operator who puts `mygame.py` next to `roadie.toml` expects."""
    target, _, attribute = path.partition(":")
    if beside is not None:
        folder = os.path.abspath(beside)
        top = os.path.join(folder, target.split(".")[0])
        if folder not in sys.path and (os.path.exists(top + ".py") or os.path.isdir(top)):
            sys.path.append(folder)  # after everything installed: a stray file shadows nothing
    try:
        imported = importlib.import_module(target)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {path!r}: {exc}") from exc
    obj = getattr(imported, attribute or "module", None)
    if not isinstance(obj, Module):
        raise ConfigError(f"{path!r} is not a roadie Module")
    return obj


def discovered_modules() -> dict[str, str]:
    """Entry points of the `roadie.modules` group: module name -> import path."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def build_registry(
    modules: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    clock: Clock | None = None,
    base_dir: str = ".",
    discover: bool = True,
    open_states: bool = True,
) -> Registry:
    """A registry of the entry-point modules plus those named in configuration.

    `modules` maps a module name to its settings table; a table with `import = "pkg:attr"`
    loads that object, one without loads the entry point of that name. With `discover`,
    every installed entry point is loaded, with empty settings unless configured. Without
    `open_states` no module's setup is run (`Registry.register`).
    """
    registry = Registry(clock)
    configured = dict(modules or {})
    found = discovered_modules() if discover else {}
    names = list(dict.fromkeys(["core", *found, *configured]))
    for name in names:
        settings = dict(configured.get(name, {}))
        if settings.get("enabled", True) is False:
            continue
        if "url" in settings or "transport" in settings:
            continue  # a remote module: `roadie.remote.attach_remote_modules` adds it
        if "console" in settings:
            continue  # a console world: `roadie.consoles.attach_console_modules` adds it
        path = settings.pop("import", None) or found.get(name)
        if path is None and name == "core":
            path = "roadie.modules.core:module"
        if path is None:
            raise ConfigError(f"module {name!r} is configured but not installed and has no 'import'")
        module = import_module_object(str(path), beside=base_dir if name in configured else None)
        if module.name != name:
            raise ConfigError(f"{path!r} is module {module.name!r}, configured as {name!r}")
        registry.register(module, settings, base_dir=base_dir, open_state=open_states)
        log.debug("module loaded", module=name, path=path)
    return registry

"""Console worlds: a game server reached only through its remote console (Quake 3 rcon,
Teeworlds econ, Source RCON) made a module by a definition file, not code (DESIGN §14).

`[modules.NAME] console = "file.yaml"` in `roadie.toml` names one; `attach_console_modules`
adds every such module to a registry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from roadie.consoles.definition import ConsoleDef, load_console, load_console_file
from roadie.consoles.module import console_module
from roadie.errors import ConfigError, DefinitionError
from roadie.registry import Registry

__all__ = ["ConsoleDef", "attach_console_modules", "console_module", "load_console", "load_console_file"]


def attach_console_modules(
    registry: Registry, modules: Mapping[str, Mapping[str, Any]], *, base_dir: str = ".", open_states: bool = True
) -> None:
    """Add each module whose table names a `console` definition file (relative to
    `base_dir`, the configuration's folder). A definition with mistakes stops the start
    with every one of them, as an event file's would."""
    for name, settings in modules.items():
        if "console" not in settings or settings.get("enabled", True) is False:
            continue
        path = os.path.join(base_dir, str(settings["console"]))
        try:
            definition = load_console_file(path)
        except DefinitionError as exc:
            raise ConfigError(f"console module {name!r}:\n{exc.message}") from exc
        registry.register(console_module(name, definition), settings, base_dir=base_dir, open_state=open_states)

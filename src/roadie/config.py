"""Configuration: `--database-url`, then `ROADIE_DATABASE_URL`, then `roadie.toml`, then the default.

```toml
database_url = "sqlite:///roadie.db"

[engine]
concurrency = 32

[modules.sandbox]
db = "sandbox.db"

[modules.mygame]
import = "mygame.roadie_module:module"

[[webhooks]]
name = "ops"
url = "https://discord.com/api/webhooks/..."
format = "discord"
```
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roadie.errors import ConfigError

DEFAULT_DATABASE_URL = "sqlite:///roadie.db"
CONFIG_FILE = "roadie.toml"


@dataclass
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    webhooks: list[Any] = field(default_factory=list)  # checked by `roadie.engine.notify.parse_webhooks`
    base_dir: str = "."
    source: str = "defaults"


def load_settings(database_url: str | None = None, config_path: str | None = None) -> Settings:
    """Read `roadie.toml` (from `config_path`, `ROADIE_CONFIG`, or the working directory)."""
    path = Path(config_path or os.environ.get("ROADIE_CONFIG") or CONFIG_FILE)
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    elif config_path:
        raise ConfigError(f"{path}: no such configuration file")
    modules = data.get("modules", {})
    if not isinstance(modules, dict) or not all(isinstance(v, dict) for v in modules.values()):
        raise ConfigError(f"{path}: [modules.NAME] must be tables")
    url = database_url or os.environ.get("ROADIE_DATABASE_URL") or data.get("database_url") or DEFAULT_DATABASE_URL
    return Settings(
        database_url=str(url),
        modules=modules,
        engine=dict(data.get("engine", {})),
        webhooks=data.get("webhooks", []),
        base_dir=str(path.parent.resolve()) if path.exists() else os.getcwd(),
        source=str(path) if path.exists() else "defaults",
    )

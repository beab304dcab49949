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

The file is checked whole when it is read, before anything is opened or written: a key
Roadie does not know, a value of the wrong type or out of range is one line naming it
(`roadie.toml: engine.claim_ttl: ...`). A value that only failed later (text where a
number belongs) once crashed a command with a traceback, or was written into the
database by a worker registering itself.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from roadie.errors import ConfigError

DEFAULT_DATABASE_URL = "sqlite:///roadie.db"
CONFIG_FILE = "roadie.toml"

# TOML has integers and floats apart: strict models take an integer where seconds are
# asked for, but no text, no boolean, and no 2.5 where a count is asked for.
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class EngineTable(BaseModel):
    """`[engine]`: what `roadie.engine.EngineOptions` takes from the file."""

    model_config = _STRICT

    concurrency: int = Field(32, ge=1)
    claim_ahead: int | None = Field(None, ge=0)
    claim_ttl: float = Field(60.0, gt=0)
    poll_interval: float = Field(1.0, gt=0)
    seed: int | None = None
    cleanups: int = Field(4, ge=1)
    cleanup_cap: int | None = Field(None, ge=0)
    cleanup_caps: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    sweep_interval: float | None = Field(600.0, ge=0)
    keep_interval: float | None = Field(30.0, ge=0)


class ModuleTable(BaseModel):
    """`[modules.NAME]`: free-form (the whole table goes to the module's setup), but for
    the keys Roadie itself reads, which are typed."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, populate_by_name=True)

    import_: str | None = Field(None, alias="import", min_length=1)
    enabled: bool = True
    url: str | None = Field(None, min_length=1)
    transport: Literal["push", "pull"] | None = None
    secret: Any = None  # a string, or a list of them while one is rotated out
    secret_env: str | None = Field(None, min_length=1)
    connect_timeout: float = Field(2.0, gt=0)
    read_timeout: float = Field(30.0, gt=0)
    call_timeout: float = Field(60.0, gt=0)
    max_connections: int = Field(100, ge=1)

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return value
        raise ValueError("should be a string, or a list of strings while one is rotated out")

    @model_validator(mode="after")
    def _console_keys(self) -> ModuleTable:
        # A console module's keys (roadie.consoles), checked only in a table that names a
        # `console` definition: elsewhere `address` or `timeout` is the module's own.
        extra = self.model_extra or {}
        if "console" not in extra:
            return self
        for key in ("console", "address", "password_env", "password_file", "password"):
            if key in extra and (not isinstance(extra[key], str) or not extra[key]):
                shown = "" if key == "password" else f", not {_shown(extra[key])}"
                raise ValueError(f"{key} should be a non-empty string{shown}")
        timeout = extra.get("timeout", 1.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"timeout should be a number of seconds over 0, not {_shown(timeout)}")
        return self


class ConfigFile(BaseModel):
    """The whole of `roadie.toml`. `[[webhooks]]` is checked by
    `roadie.engine.notify.parse_webhooks`, which names the table's index."""

    model_config = _STRICT

    database_url: str | None = Field(None, min_length=1)
    engine: EngineTable = Field(default_factory=EngineTable)
    modules: dict[str, ModuleTable] = Field(default_factory=dict)
    webhooks: list[Any] = Field(default_factory=list)


@dataclass
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    webhooks: list[Any] = field(default_factory=list)  # checked by `roadie.engine.notify.parse_webhooks`
    base_dir: str = "."
    source: str = "defaults"


def load_settings(database_url: str | None = None, config_path: str | None = None) -> Settings:
    """Read `roadie.toml` (from `config_path`, `ROADIE_CONFIG`, or the working directory)
    and check it (`check_file`)."""
    path = Path(config_path or os.environ.get("ROADIE_CONFIG") or CONFIG_FILE)
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    elif config_path:
        raise ConfigError(f"{path}: no such configuration file")
    source = str(path) if path.exists() else "defaults"
    checked = check_file(data, source)
    url = database_url or os.environ.get("ROADIE_DATABASE_URL") or checked.database_url or DEFAULT_DATABASE_URL
    return Settings(
        database_url=str(url),
        modules={name: dict(table) for name, table in data.get("modules", {}).items()},
        engine=dict(data.get("engine", {})),
        webhooks=list(data.get("webhooks", [])),
        base_dir=str(path.parent.resolve()) if path.exists() else os.getcwd(),
        source=source,
    )


def check_file(data: dict[str, Any], source: str) -> ConfigFile:
    """`data`, a configuration file's contents, checked; the first problems as one line."""
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_problem(e) for e in exc.errors())) from None


def check_engine(table: dict[str, Any], source: str) -> EngineTable:
    """`[engine]` alone, checked as `check_file` does."""
    return check_file({"engine": table}, source).engine


# Where an unknown key was found -> the keys known there, for a did-you-mean.
_KNOWN: dict[tuple[str, ...], tuple[str, ...]] = {
    (): tuple(ConfigFile.model_fields),
    ("engine",): tuple(EngineTable.model_fields),
}


def _problem(error: ErrorDetails) -> str:
    """One problem as `engine.claim_ttl: Input should be a valid number, not 'abc'`."""
    loc = tuple(str(p) for p in error["loc"])
    where = ".".join(loc) or "file"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key{_did_you_mean(loc)}"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] not in ("missing", "value_error") and "secret" not in loc:  # a secret is never shown
        message += f", not {_shown(error['input'])}"
    return f"{where}: {message}"


def _did_you_mean(loc: tuple[str, ...]) -> str:
    *parent, key = loc
    if tuple(parent) == () and key in EngineTable.model_fields:
        return f"; it belongs under [engine]: engine.{key}"
    if tuple(parent) == ("engine",) and key in ConfigFile.model_fields:
        return f"; {key} belongs at the top, before the first [table]"
    known = _KNOWN.get(tuple(parent), ())
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"; did you mean {'.'.join([*parent, close[0]])}?"
    return f" (known: {', '.join(known)})" if known else ""


def _shown(value: Any) -> str:
    """A value as the message shows it: a table by its kind, not its contents (it may hold
    a secret)."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)

"""A console world's definition file: how to reach its console, and for each action and
lease the commands that do, read back and undo it. Checked as an event file is: every
mistake reported at once, `file:line: field: message`.

```yaml
console: arena                   # the module's name
transport: quake3                # quake3 | teeworlds | source
address: 127.0.0.1:27960
password_env: ROADIE_RCON_ARENA  # or password_file: (never in this file)
leases:
  gravity:
    read: g_gravity
    parse: '"g_gravity" is:"(?P<value>[^"^]*)'
    write: g_gravity {{ value }}
    value: {type: number, minimum: 0, maximum: 5000}
actions:
  bots:
    reversible: ledger
    kind: bot
    ref: "{{ key }}.{{ index }}"  # each bot's name: the step's key, so it is tagged
    count: count
    do: addbot {{ bot }} 2 free 0 {{ ref }}
    revert: kick {{ ref }}
    list: status                  # its reply names every bot present
    params:
      bot: {type: string, default: sarge}
      count: {type: integer, minimum: 1, maximum: 8, default: 1}
```
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from typing import Any

from jinja2 import meta
from jinja2.exceptions import TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from roadie.definitions.loader import line_of, parse_with_lines
from roadie.definitions.render import error_message, field_path, suggest
from roadie.errors import DefinitionError, Problem
from roadie.states import Reversible

_NAME = r"^[a-z][a-z0-9_]*$"
MAX_FILE = 1_000_000


class TransportName(StrEnum):
    QUAKE3 = "quake3"
    TEETWORLDS = "teeworlds"
    SOURCE = "source"


ERRORS: dict[TransportName, list[str]] = {
    # What each console answers to a command it did not carry out.
    TransportName.QUAKE3: [r"^[Uu]nknown command", r"^(\^\d)?Error:", r"^[Uu]sage: "],
    TransportName.TEETWORLDS: [r"^No such command", r"^Invalid arguments", r"^Access denied"],
    TransportName.SOURCE: [r"^Unknown (or incomplete )?command", r"^Incorrect argument", r"^Unknown command"],
}

Commands = str | list[str]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LeaseDef(_Strict):
    """A setting the console can read and write: borrowed by `core.lease`."""

    description: str = ""
    read: str = Field(description="the command that prints the value")
    parse: str = Field(r"(?P<value>.*)", description="a regular expression; its group `value` is the value")
    write: Commands = Field(description="the command(s) that set it: {{ value }}")
    restore: Commands | None = Field(None, description="the command(s) that give the saved value back, if not write")
    value: dict[str, Any] = Field(default_factory=lambda: {"type": "string"})
    targeted: bool = False
    targets: list[str] | None = Field(None, description="the targets a borrow may name (targeted leases)")
    stacks: bool = False


class ActionDef(_Strict):
    """A command a step can call, and for a `ledger` action how what it made is tagged,
    read back and taken down."""

    description: str = ""
    reversible: Reversible
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)
    do: Commands
    kind: str | None = None
    ref: str | None = Field(None, description="each object's tag, from {{ key }} (and {{ index }})")
    count: str | None = Field(None, description="the param that says how many objects one step makes")
    revert: Commands | None = None
    revert_key: Commands | None = Field(None, description="take down everything one key made, at once")
    listing: str | None = Field(None, alias="list", description="a command whose reply names every object present")
    check: str | None = Field(None, description="a command that asks after one object")
    present: str | None = Field(None, description="a regular expression check's reply matches when it is there")


class ConsoleDef(_Strict):
    console: str = Field(pattern=_NAME)
    description: str = ""
    transport: TransportName
    address: str | None = Field(None, description="host:port of the console")
    password_env: str | None = None
    password_file: str | None = None
    timeout: float = Field(3.0, gt=0, le=60)
    rate: float | None = Field(None, gt=0, le=100, description="quake3: commands a second, after a burst")
    burst: int | None = Field(None, ge=1, le=100, description="quake3: commands sent at once before pacing")
    marker: str = Field("", description="source: the command sent after each to find its reply's end")
    errors: list[str] | None = Field(None, description="regular expressions of a reply that means 'not done'")
    actions: dict[str, ActionDef] = Field(default_factory=dict)
    leases: dict[str, LeaseDef] = Field(default_factory=dict)

    def error_patterns(self) -> list[re.Pattern[str]]:
        patterns = ERRORS[self.transport] if self.errors is None else self.errors
        return [re.compile(p, re.MULTILINE) for p in patterns]


# What a command template sees besides an action's params.
ACTION_NAMES = frozenset({"key", "ref", "index", "run_id"})
LEASE_NAMES = frozenset({"value", "target"})
_env = SandboxedEnvironment()
_env.filters["word"] = str  # the console module's: a value sent bare, as one word


def load_console_file(path: str | os.PathLike[str]) -> ConsoleDef:
    source = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DefinitionError([Problem(source, None, "", f"cannot read the file: {exc}")]) from exc
    if len(raw) > MAX_FILE:
        raise DefinitionError([Problem(source, None, "", f"the file is larger than {MAX_FILE:,} bytes")])
    return load_console(text, source)


def load_console(text: str, source: str) -> ConsoleDef:
    """Parse and check one console definition, or raise DefinitionError with every problem."""
    data, lines = parse_with_lines(text, source)
    if not isinstance(data, dict):
        raise DefinitionError([Problem(source, 1, "", "a console definition must be a mapping")])
    problems: list[Problem] = []

    def add(path: tuple[str | int, ...], message: str) -> None:
        problems.append(Problem(source, line_of(lines, path), field_path(path), message))

    try:
        definition = ConsoleDef.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            add(tuple(error["loc"]), error_message(error, ConsoleDef))
        problems.sort(key=lambda p: p.line or 0)
        raise DefinitionError(problems) from None
    _Checks(definition, add).run()
    if problems:
        problems.sort(key=lambda p: p.line or 0)
        raise DefinitionError(problems)
    return definition


class _Checks:
    """What the model alone cannot say: templates, patterns, and what a class allows."""

    def __init__(self, definition: ConsoleDef, add: Any) -> None:
        self.d = definition
        self.add = add

    def run(self) -> None:
        d = self.d
        if d.address is not None and not _address_ok(d.address):
            self.add(("address",), f"{d.address!r} is not host:port")
        if d.password_env is not None and d.password_file is not None:
            self.add(("password_file",), "give password_env or password_file, not both")
        for field in ("rate", "burst"):
            if getattr(d, field) is not None and d.transport is not TransportName.QUAKE3:
                self.add((field,), "only a quake3 console is paced")
        for index, pattern in enumerate(d.errors or []):
            self._pattern(("errors", index), pattern)
        for name, lease in d.leases.items():
            self._lease(name, lease)
        for name, action in d.actions.items():
            self._action(name, action)

    def _name(self, path: tuple[str | int, ...], name: str) -> bool:
        if not re.match(_NAME, name):
            self.add(path, f"{name!r} must be lowercase letters, digits and _")
            return False
        return True

    def _template(self, path: tuple[str | int, ...], text: str, names: set[str] | frozenset[str]) -> set[str]:
        try:
            used = meta.find_undeclared_variables(_env.parse(text))
        except TemplateSyntaxError as exc:
            self.add(path, f"template syntax error: {exc.message}")
            return set()
        for unknown in sorted(used - set(names)):
            self.add(path, f"{unknown!r} is not a name this template can use{suggest(unknown, names)}")
        return set(used)

    def _commands(self, path: tuple[str | int, ...], commands: Commands | None, names: Any) -> set[str]:
        used: set[str] = set()
        if commands is None:
            return used
        if isinstance(commands, str):
            return self._template(path, commands, names)
        if not commands:
            self.add(path, "give at least one command")
        for index, command in enumerate(commands):
            used |= self._template((*path, index), command, names)
        return used

    def _pattern(self, path: tuple[str | int, ...], pattern: str, group: str | None = None) -> None:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            self.add(path, f"not a regular expression: {exc}")
            return
        if group is not None and group not in compiled.groupindex:
            self.add(path, f"the pattern needs a group named {group!r}: (?P<{group}>...)")

    def _lease(self, name: str, lease: LeaseDef) -> None:
        where = ("leases", name)
        if not self._name(where, name):
            return
        names = LEASE_NAMES if lease.targeted else LEASE_NAMES - {"target"}
        self._template((*where, "read"), lease.read, names - {"value"})
        self._pattern((*where, "parse"), lease.parse, "value")
        self._commands((*where, "write"), lease.write, names)
        self._commands((*where, "restore"), lease.restore, names)
        if lease.value.get("type") not in ("string", "number", "integer", "boolean"):
            self.add((*where, "value"), "a value's type is string, number, integer or boolean")
        if lease.targets is not None and not lease.targeted:
            self.add((*where, "targets"), "only a targeted lease names targets")

    def _action(self, name: str, action: ActionDef) -> None:
        where = ("actions", name)
        if not self._name(where, name):
            return
        params = set(action.params)
        for param in sorted(params & ACTION_NAMES):
            self.add((*where, "params", param), f"{param!r} is a name every command has: call the param otherwise")
        for param in action.required:
            if param not in params:
                self.add((*where, "required"), f"{param!r} is not a param{suggest(param, params)}")
        names = params | ACTION_NAMES
        ledger = action.reversible is Reversible.LEDGER
        if action.reversible is Reversible.OVERRIDE:
            self.add((*where, "reversible"), "a console borrows settings through leases: declare it under leases")
            return
        if action.count is not None:
            spec = action.params.get(action.count)
            if spec is None:
                self.add((*where, "count"), f"{action.count!r} is not a param{suggest(action.count, params)}")
            elif spec.get("type") != "integer" or "maximum" not in spec:
                self.add((*where, "count"), f"the param {action.count!r} must be an integer with a maximum")
        if not ledger:
            for field in ("kind", "ref", "revert", "revert_key", "listing", "check", "present"):
                if getattr(action, field) is not None:
                    field = field.replace("listing", "list")
                    self.add(
                        (*where, field),
                        f"only a 'ledger' action has {field!r}: a {action.reversible} one is not taken down",
                    )
            self._commands((*where, "do"), action.do, names - {"ref", "index"})
            return
        # A ledger action must tag what it makes and read it back, or cleanup could not
        # find it after an answer was lost, nor tell it from what a player made.
        for field in ("kind", "ref", "revert"):
            if getattr(action, field) is None:
                self.add((*where, field), f"a 'ledger' action needs {field!r}")
        if action.listing is None and action.check is None:
            self.add((*where, "list"), "a 'ledger' action needs a read-back: 'list' or 'check' with 'present'")
        if action.check is not None and action.present is None:
            self.add((*where, "present"), "'check' needs 'present', the pattern of a reply that finds it")
        if action.ref is not None and "key" not in self._template((*where, "ref"), action.ref, {"key", "index"}):
            self.add((*where, "ref"), "the tag must hold the step's key: {{ key }}")
        self._commands((*where, "do"), action.do, names)
        self._commands((*where, "revert"), action.revert, {"key", "ref", "index", "run_id"})
        self._commands((*where, "revert_key"), action.revert_key, {"key", "run_id"})
        if action.listing is not None:
            self._template((*where, "list"), action.listing, set())
        if action.check is not None:
            self._template((*where, "check"), action.check, {"key", "ref"})
        if action.present is not None:
            self._pattern((*where, "present"), action.present)


def _address_ok(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536

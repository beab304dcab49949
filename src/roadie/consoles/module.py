"""A console definition made into a module: each action's commands rendered with the
step's params and sent, what a `ledger` action made found again by its tag, each lease
read by its pattern.

Nothing here keeps a key ledger of its own: the world is the ledger. A ledger action's
objects carry the step's key in their tag, so a dispatch that comes again (a retry, an
answer lost) reads the world back first and makes only what is not there yet, and a
revert given no resources finds by the key what the step made. Over UDP, where a reply
can be lost after the command ran, that read-back is the only safe way to go on.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from jinja2 import StrictUndefined
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel

from roadie.consoles.definition import ActionDef, Commands, ConsoleDef, LeaseDef, TransportName
from roadie.consoles.econ import TeeworldsEcon
from roadie.consoles.quake3 import Quake3Rcon
from roadie.consoles.source_rcon import SourceRcon
from roadie.consoles.transport import (
    WORD,
    Console,
    ConsoleAuthFailed,
    ConsoleError,
    ReplyLost,
    UnsafeValue,
    check_line,
)
from roadie.errors import ConfigError, PermanentError, RetryableError
from roadie.log import get_logger
from roadie.protocol import lease_fence_target
from roadie.registry import (
    Answer,
    Call,
    InspectCall,
    Inspected,
    LeaseCall,
    Module,
    ModuleConfig,
    RevertCall,
    RevertFailure,
    Tagged,
    TaggedCall,
    TaggedPage,
)
from roadie.registry.fences import FenceMarks
from roadie.remote.schema import params_model
from roadie.states import Reversible

log = get_logger(__name__)

Fenced = tuple[str, int, bool]
"""What a command is sent for: a target, the fence of its call, whether it is a lease's."""

KEY_PATTERN = r"[0-9a-f]{6,32}-\d+-\d+-\d+"
"""A step's idempotency key as the engine mints it: `nonce-run-phase-seq`."""
REVERT_ROUNDS = 3
"""How many times a revert sends its commands for what the world still shows: over UDP a
command can be lost, or dropped by a server that rate-limits, and what the read-back shows
still there is sent again (never blindly: only what is seen)."""


class Bare(str):
    """A value Roadie made itself (a key, a tag, a target it checked): sent as one word."""


class _Commands(SandboxedEnvironment):
    """Command templates: whatever a template puts into a command passes the console's
    quoting, so no value can end the command or start another."""

    def __init__(self, console: Console) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False, finalize=self._value)
        self.console = console
        self.filters["word"] = word

    def _value(self, value: Any) -> str:
        if isinstance(value, Bare):
            if not WORD.match(value):
                raise UnsafeValue(f"{value!r} is not one word")
            return str(value)
        if isinstance(value, bool):
            return self.console.quoting.true if value else self.console.quoting.false
        if isinstance(value, int | float):
            return format_number(value)
        return self.console.quoting.quote(str(value))


def word(value: Any) -> Bare:
    """`{{ entity | word }}`: a value sent bare, as one word (an identifier, a selector),
    refused unless it is one."""
    text = str(value)
    if not WORD.match(text):
        raise UnsafeValue(f"{text!r} is not one word (letters, digits and _.:+@#=-)")
    return Bare(text)


def format_number(value: float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise UnsafeValue(f"{value!r} is not a number a console takes")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def open_console(definition: ConsoleDef, settings: dict[str, Any], base_dir: str, name: str) -> Console:
    """The transport, at the address and with the password `roadie.toml`'s table gives
    (`address`; `password`, `password_env` or `password_file`), else the definition's.
    The definition never holds a password itself: only where to read it."""
    address = settings.get("address") or definition.address
    if not address:
        raise ConfigError(f'console module {name!r}: no address (give address = "host:port" in its table)')
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"console module {name!r}: address {address!r} is not host:port")
    password = _password(definition, settings, base_dir, name)
    timeout = float(settings.get("timeout", definition.timeout))
    if definition.transport is TransportName.QUAKE3:
        return Quake3Rcon(
            host, int(port), password, timeout=timeout, burst=definition.burst or 8, rate=definition.rate or 0.9
        )
    if definition.transport is TransportName.TEETWORLDS:
        return TeeworldsEcon(host, int(port), password, timeout=timeout)
    return SourceRcon(host, int(port), password, timeout=timeout, marker=definition.marker)


def _password(definition: ConsoleDef, settings: dict[str, Any], base_dir: str, name: str) -> str:
    env = settings.get("password_env") or definition.password_env
    file = settings.get("password_file") or definition.password_file
    if "password" in settings:
        return str(settings["password"])
    if file is not None and env is None:
        path = os.path.join(base_dir, str(file))
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError as exc:
            raise ConfigError(f"console module {name!r}: cannot read password_file {path}: {exc.strerror}") from exc
    env = env or f"ROADIE_CONSOLE_{name.upper()}"
    value = os.environ.get(str(env))
    if not value:
        raise ConfigError(f"console module {name!r}: set the console's password in ${env} (or give password_file)")
    return value


@dataclass
class ConsoleWorld:
    """A console module's state: the definition, the open console, and the fence marks of
    what it has changed (a server cannot keep them: this process refuses for it)."""

    definition: ConsoleDef
    console: Console
    commands: _Commands
    errors: list[re.Pattern[str]]
    fences: FenceMarks = field(default_factory=FenceMarks)

    async def run(self, command: str, fenced: Fenced = ("", 0, False)) -> str:
        """Send a command that changes the world, for `fenced` (a target, the fence of the
        call it is sent for, whether the target is a lease's: refused once a newer owner
        has acted for it); a reply that says it was not carried out fails it."""
        target, fence, lease = fenced
        self.fences.check(target, fence, lease=lease)
        reply = await self.console.send(check_line(command))
        self._refused(command, reply)
        return reply

    async def read(self, command: str) -> str:
        reply = await self.console.read(check_line(command))
        self._refused(command, reply)
        return reply

    def _refused(self, command: str, reply: str) -> None:
        for pattern in self.errors:
            found = pattern.search(reply)
            if found:
                line = reply[found.start() :].splitlines()[0].strip()
                raise PermanentError(f"the console refused {command.split(' ')[0]!r}: {line}")

    def render(self, template: str, context: dict[str, Any]) -> str:
        return self.commands.from_string(template).render(context)

    def render_all(self, commands: Commands, context: dict[str, Any]) -> list[str]:
        return [self.render(c, context) for c in ([commands] if isinstance(commands, str) else commands)]


def console_module(name: str, definition: ConsoleDef) -> Module:
    """A Module whose actions and leases are the definition's."""
    module = Module(name, definition.description or f"{definition.transport} console")

    @module.setup
    def setup(config: ModuleConfig) -> ConsoleWorld:
        console = open_console(definition, dict(config.settings), config.base_dir, name)
        return ConsoleWorld(definition, console, _Commands(console), definition.error_patterns())

    @module.close
    async def close(world: ConsoleWorld | None) -> None:
        if world is not None:
            await world.console.close()

    @module.online
    async def online(world: ConsoleWorld | None) -> str | None:
        """Pre-flight: one command that changes nothing, so a run is not started against a
        console that cannot be reached or refuses the password."""
        if world is None:
            return None
        try:
            await world.console.read(PROBES[definition.transport], attempts=2)
        except ConsoleError as exc:
            return f"its console does not answer: {exc.message}"
        return None

    for action_name, action in definition.actions.items():
        _add_action(module, name, action_name, action, definition.transport)
    for lease_name, lease in definition.leases.items():
        _add_lease(module, lease_name, lease, definition.transport)
    ledger = {n: a for n, a in definition.actions.items() if a.reversible is Reversible.LEDGER}
    if ledger:
        _add_inspect(module, ledger)
    if any(a.listing is not None for a in ledger.values()):
        _add_tagged(module, ledger)
    return module


# --- actions ------------------------------------------------------------------------------


# What pre-flight sends to see that a console answers: a read that changes nothing.
PROBES = {TransportName.QUAKE3: "sv_hostname", TransportName.TEETWORLDS: "sv_name", TransportName.SOURCE: ""}

QUOTING = {
    TransportName.QUAKE3: Quake3Rcon.quoting,
    TransportName.TEETWORLDS: TeeworldsEcon.quoting,
    TransportName.SOURCE: SourceRcon.quoting,
}


def sendable(spec: dict[str, Any], transport: TransportName) -> dict[str, Any]:
    """A string's schema, narrowed to what the console can be sent: an event that gives a
    value the console would refuse is refused when it is validated, at its line, rather
    than when its step runs."""
    if spec.get("type") != "string" or "enum" in spec or "const" in spec:
        return spec
    forbidden = re.escape(QUOTING[transport].forbidden)
    guard = {"pattern": f"^[^{forbidden}\\x00-\\x1f\\x7f]*$"}
    if "pattern" not in spec:
        return {**spec, **guard}
    return {
        "allOf": [spec, {"type": "string", **guard}],
        **{k: spec[k] for k in ("default", "description") if k in spec},
    }


def _schema(action: ActionDef, transport: TransportName) -> dict[str, Any]:
    required = sorted(set(action.required) | {p for p, s in action.params.items() if "default" not in s})
    properties = {name: sendable(spec, transport) for name, spec in action.params.items()}
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _params(call_params: BaseModel) -> dict[str, Any]:
    return call_params.model_dump(mode="json", by_alias=True)


def _context(call: Call[Any]) -> dict[str, Any]:
    return {**_params(call.params), "key": Bare(call.idempotency_key), "run_id": call.run_id}


def _count(action: ActionDef, params: dict[str, Any]) -> int:
    return int(params[action.count]) if action.count is not None else 1


def _refs(world: ConsoleWorld, action: ActionDef, context: dict[str, Any], count: int) -> list[str]:
    assert action.ref is not None
    return [world.render(action.ref, {**context, "index": index}) for index in range(count)]


def _add_action(module: Module, module_name: str, name: str, action: ActionDef, transport: TransportName) -> None:
    action_id = f"{module_name}.{name}"
    params = params_model(action_id, _schema(action, transport))

    async def do(call: Call[Any]) -> Answer:
        world: ConsoleWorld = call.state
        context = _context(call)
        fenced = (call.idempotency_key, call.fence, False)
        world.fences.accept(call.idempotency_key, call.fence)
        if action.reversible is not Reversible.LEDGER:
            return await _do_once(world, action, context, fenced)
        try:
            refs = _refs(world, action, context, _count(action, context))
            present = await _present(world, action, refs)
            for index, ref in enumerate(refs):
                if ref in present:
                    continue  # made by an earlier attempt whose answer never came back
                try:
                    for command in world.render_all(action.do, {**context, "ref": Bare(ref), "index": index}):
                        await world.run(command, fenced)
                except ReplyLost:
                    log.warning("console reply lost: reading the world back", action=action_id, ref=ref)
                    break
            present = await _present(world, action, refs)
        except ConsoleError as exc:
            raise _as_step_error(exc) from exc
        missing = [r for r in refs if r not in present]
        if missing:
            raise RetryableError(f"{len(missing)} of {len(refs)} not in the world after the command: read back first")
        return Answer(resources=[{"kind": action.kind, "ref": ref} for ref in refs])

    async def revert(call: RevertCall) -> list[RevertFailure]:
        world: ConsoleWorld = call.state
        context = {"key": Bare(call.idempotency_key), "run_id": call.run_id}
        fenced = (call.idempotency_key, call.fence, False)
        world.fences.accept(call.idempotency_key, call.fence)
        try:
            if call.resources:
                refs = [r.ref for r in call.resources]
            else:  # the step's answer was lost: whatever carries its key
                refs = await _made_by(world, action, call.idempotency_key, context)
            if action.revert_key is not None:
                for command in world.render_all(action.revert_key, context):
                    await _undo(world, command, fenced)
            still = await _present(world, action, refs)  # what is gone already is reverted
            for _ in range(REVERT_ROUNDS):
                if not still:
                    break
                for ref in [r for r in refs if r in still]:
                    assert action.revert is not None
                    for command in world.render_all(action.revert, {**context, "ref": Bare(ref), "index": 0}):
                        await _undo(world, command, fenced)
                still = await _present(world, action, refs)
        except ConsoleError as exc:
            raise _as_step_error(exc) from exc
        gone_wrong = [ref for ref in refs if ref in still]
        return [RevertFailure(action.kind or "", ref, "still in the world after its revert") for ref in gone_wrong]

    registered = module.action(
        name, reversible=action.reversible, params=params, description=action.description or name
    )(do)
    if action.reversible is Reversible.LEDGER:
        registered.revert(revert)


async def _do_once(world: ConsoleWorld, action: ActionDef, context: dict[str, Any], fenced: Fenced) -> Answer:
    """A `none` or `self` action: sent once. Over UDP a lost reply is not sent again (a
    second broadcast cannot be taken back either): the step is done, unconfirmed."""
    replies: list[str] = []
    for command in world.render_all(action.do, context):
        try:
            replies.append(await world.run(command, fenced))
        except ReplyLost:
            return Answer(output={"confirmed": False})
        except ConsoleError as exc:
            raise _as_step_error(exc) from exc
    return Answer(output={"confirmed": True, "reply": "\n".join(replies)[-2000:].strip()})


async def _undo(world: ConsoleWorld, command: str, fenced: Fenced) -> None:
    with contextlib.suppress(ReplyLost):  # what is still there is read back next, and reported
        await world.run(command, fenced)


def _as_step_error(exc: Exception) -> Exception:
    if isinstance(exc, PermanentError | RetryableError):
        return exc
    if isinstance(exc, ConsoleAuthFailed | UnsafeValue):
        return PermanentError(str(exc))
    return RetryableError(str(exc))


async def _present(world: ConsoleWorld, action: ActionDef, refs: list[str]) -> set[str]:
    """Which of `refs` the world shows now."""
    if not refs:
        return set()
    if action.listing is not None:
        reply = await world.read(world.render(action.listing, {}))
        return {ref for ref in refs if _word(ref).search(reply)}
    assert action.check is not None
    assert action.present is not None
    found = set()
    for ref in refs:
        reply = await world.read(world.render(action.check, {"ref": Bare(ref), "key": Bare(ref)}))
        if re.search(action.present, reply, re.MULTILINE):
            found.add(ref)
    return found


def _word(ref: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.-])" + re.escape(ref) + r"(?![\w.-])")


def tag_pattern(world: ConsoleWorld, action: ActionDef, key: str | None = None) -> re.Pattern[str]:
    """What the tags of `action` look like, with the key (given, or any) as group `key`."""
    assert action.ref is not None
    key_mark, index_mark = "KEYMARKROADIE", "7770777"
    text = world.render(action.ref, {"key": Bare(key_mark), "index": int(index_mark)})
    key_part = f"(?P<key>{re.escape(key) if key else KEY_PATTERN})"
    pattern = re.escape(text).replace(key_mark, key_part).replace(index_mark, r"\d+")
    return re.compile(r"(?<![\w.-])" + pattern + r"(?![\w.-])")


async def _made_by(world: ConsoleWorld, action: ActionDef, key: str, context: dict[str, Any]) -> list[str]:
    if action.listing is not None:
        reply = await world.read(world.render(action.listing, {}))
        return sorted({m.group(0) for m in tag_pattern(world, action, key).finditer(reply)})
    # A per-object check: every index the step could have made.
    spec = action.params.get(action.count) if action.count else None
    most = int(spec["maximum"]) if spec else 1
    return _refs(world, action, context, most)


# --- read-back ----------------------------------------------------------------------------


def _add_inspect(module: Module, ledger: dict[str, ActionDef]) -> None:
    @module.inspect
    async def inspect(call: InspectCall) -> list[Inspected]:
        world: ConsoleWorld = call.state
        action = ledger.get(call.action or "") or next(iter(ledger.values()))
        try:
            present = await _present(world, action, [r.ref for r in call.resources])
        except ConsoleError as exc:
            raise _as_step_error(exc) from exc
        # A tag holds the key, so an object found by it is the step's own.
        return [Inspected(r.kind, r.ref, r.ref in present, r.ref in present) for r in call.resources]


def _add_tagged(module: Module, ledger: dict[str, ActionDef]) -> None:
    @module.tagged
    async def tagged(call: TaggedCall) -> TaggedPage:
        world: ConsoleWorld = call.state
        found: dict[str, Tagged] = {}
        replies: dict[str, str] = {}
        for action in ledger.values():
            if action.listing is None:
                continue
            command = world.render(action.listing, {})
            if command not in replies:
                replies[command] = await world.read(command)
            for match in tag_pattern(world, action).finditer(replies[command]):
                found.setdefault(match.group(0), Tagged(action.kind or "", match.group(0), match.group("key")))
        refs = sorted(r for r in found if call.after is None or r > call.after)
        page = refs[: call.limit]
        more = len(refs) > call.limit
        return TaggedPage([found[r] for r in page], page[-1] if more and page else None)


# --- leases -------------------------------------------------------------------------------


def parse_value(lease: LeaseDef, text: str) -> Any:
    kind = lease.value.get("type")
    text = text.strip()
    try:
        if kind == "number":
            number = float(text)
            return int(number) if number.is_integer() else number
        if kind == "integer":
            return int(float(text))
        if kind == "boolean":
            return text.lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise PermanentError(f"{text!r} is not a {kind}") from None
    return text


def _add_lease(module: Module, name: str, lease: LeaseDef, transport: TransportName) -> None:
    def context(call: LeaseCall) -> dict[str, Any]:
        if call.target is None:
            return {}
        if lease.targets is not None and call.target not in lease.targets:
            raise PermanentError(f"{call.target!r} is not one of this lease's targets: {', '.join(lease.targets)}")
        return {"target": Bare(call.target)}

    async def read(call: LeaseCall) -> Any:
        world: ConsoleWorld = call.state
        try:
            reply = await world.read(world.render(lease.read, context(call)))
        except ConsoleError as exc:
            raise _as_step_error(exc) from exc
        found = re.search(lease.parse, reply, re.MULTILINE)
        if found is None:
            shown = reply.strip()[:200]
            raise RetryableError(f"the reply to {lease.read!r} did not match its parse pattern: {shown!r}")
        return parse_value(lease, found.group("value"))

    async def put(call: LeaseCall, value: Any, commands: Commands) -> None:
        world: ConsoleWorld = call.state
        fenced = (lease_fence_target(name, call.target), call.fence, True)
        world.fences.accept(fenced[0], call.fence, lease=True)
        try:
            for command in world.render_all(commands, {**context(call), "value": value}):
                try:
                    await world.run(command, fenced)
                except ReplyLost:
                    log.warning("console reply lost: reading the setting back", lease=name)
        except ConsoleError as exc:
            raise _as_step_error(exc) from exc
        shown = await read(call)
        if shown != value and not (isinstance(value, str) and str(shown) == value.strip()):
            raise RetryableError(f"wrote {value!r}, the console reads back {shown!r}")

    registered = module.lease(
        name,
        targeted=lease.targeted,
        stacks=lease.stacks,
        description=lease.description or name,
        value=sendable(lease.value, transport),
    )(read)

    async def write(call: LeaseCall, value: Any) -> None:
        await put(call, value, lease.write)

    registered.write(write)
    if lease.restore is not None:
        restore_commands = lease.restore

        async def restore(call: LeaseCall, value: Any) -> None:
            await put(call, value, restore_commands)

        registered.restore(restore)

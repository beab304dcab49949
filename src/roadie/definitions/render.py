"""Substitute a run's parameters into an event and validate every step: what a run freezes.

Templates are Jinja, evaluated in a sandbox with strict undefined names, because event
files are written by staff, not by developers, and may arrive through the HTTP API. A value
that is exactly one expression (`"{{ count }}"`) keeps the expression's own type, so an
`int` param reaches the action as an int and a list as a list; any other template renders
to a string.

The helpers that turn a Pydantic error into an operator's message live here too, because
both halves — the loader checking a file and `render` checking a run — report them alike.
"""

from __future__ import annotations

import ctypes
import difflib
import json
import re
import threading
import types
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from functools import lru_cache
from typing import Any, TypeVar, Union, get_args, get_origin

import jsonschema
from jinja2 import Undefined
from jinja2.environment import Template, TemplateExpression
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from roadie.definitions.model import (
    EventDefinition,
    FrozenDefinition,
    RenderedPhase,
    RenderedStep,
)
from roadie.definitions.sandbox import ENV, MAX_SEQUENCE, weight
from roadie.durations import format_duration, parse_duration
from roadie.errors import DefinitionError, Problem, UnknownAction, UnknownLease
from roadie.registry.module import Action
from roadie.registry.registry import Registry

FieldPath = tuple[str | int, ...]

RESERVED_NAMES = frozenset({"params", "event", "run"})
"""Names a template sees besides the params themselves; no param may take one."""

# How long the templates of one event may take (nested loops); what they may build is
# bounded by the sandbox (sandbox.py), operation by operation.
RENDER_SECONDS = 2.0
# What a run's steps may hold in all, as JSON: each value is bounded by MAX_SEQUENCE, but
# a file of many steps could still render gigabytes, every byte stored and dispatched.
MAX_RUN_CHARACTERS = 16_000_000
RUN_TOO_LARGE = (
    f"the run's steps come to more than {MAX_RUN_CHARACTERS:,} characters of parameters by this step; "
    "a run holds at most that (give large data to a module by reference)"
)


def json_size(values: Any) -> int:
    """What `values` come to as compact JSON, in characters."""
    return len(json.dumps(values, separators=(",", ":"), default=str))


T = TypeVar("T")

# `{{ expr }}` with nothing around it; `-`/`+` are Jinja's whitespace control marks.
_SINGLE_EXPRESSION = re.compile(r"^\{\{[-+]?(?P<expr>.*?)[-+]?\}\}$", re.DOTALL)
_TEMPLATE_MARKS = ("{{", "}}", "{%", "%}", "{#", "#}")


class TemplateFailure(Exception):
    """A template at `path` (relative to where rendering started) could not be evaluated."""

    def __init__(self, path: FieldPath, error: Exception) -> None:
        super().__init__(describe_template_error(error))
        self.path = path
        self.error = error


def is_template(text: str) -> bool:
    """Whether a string holds a Jinja expression or statement."""
    return "{{" in text or "{%" in text


def has_template(value: Any) -> bool:
    """Whether a `with:` value holds a template anywhere inside its dicts and lists."""
    if isinstance(value, str):
        return is_template(value)
    if isinstance(value, dict):
        return any(has_template(v) for v in value.values())
    if isinstance(value, list):
        return any(has_template(v) for v in value)
    return False


def template_strings(value: Any, path: FieldPath = ()) -> Iterator[tuple[FieldPath, str]]:
    """Every templated string inside a `with:` value, with its path below the value."""
    if isinstance(value, str):
        if is_template(value):
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from template_strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from template_strings(item, (*path, index))


@lru_cache(maxsize=2048)
def compile_template(source: str) -> Template | TemplateExpression:
    """The compiled form of a templated string; raises TemplateSyntaxError.

    A lone `{{ expr }}` compiles as an expression so that its value keeps its type.
    """
    match = _SINGLE_EXPRESSION.match(source.strip())
    if match and not any(mark in match["expr"] for mark in _TEMPLATE_MARKS):
        return ENV.compile_expression(match["expr"], undefined_to_none=False)
    return ENV.from_string(source)


def render_string(source: str, context: Mapping[str, Any]) -> Any:
    """Evaluate one templated string; any failure propagates as raised by Jinja or Python."""
    compiled = compile_template(source)
    if isinstance(compiled, TemplateExpression):
        value = compiled(**context)
        if weight(value) > MAX_SEQUENCE:
            raise SecurityError(f"the value would come to more than {MAX_SEQUENCE:,} characters")
        return _plain(value)
    size, parts = 0, []
    for part in compiled.generate(**context):
        size += len(part)
        if size > MAX_SEQUENCE:
            raise SecurityError(f"the template writes more than {MAX_SEQUENCE:,} characters")
        parts.append(part)
    return "".join(parts)


class _OutOfTime(BaseException):
    """Raised inside a render that ran past its time: a BaseException, so that no handler
    of a template or of the code it calls takes it for the template's own error."""


def within(seconds: float, work: Callable[[], T]) -> T | None:
    """`work()` in a thread of its own, stopped when it runs past `seconds`; None then.

    Templates are Python bytecode once compiled, so the exception sent into the thread
    lands at the next instruction even inside a loop; one long call into C (which the
    sandbox's size bounds keep short) is waited out.
    """
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except _OutOfTime:
            pass
        except BaseException as exc:  # handed to the caller, raised there
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="roadie-render", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive() and thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_OutOfTime))
        thread.join()
    if not outcome:
        return None
    done, value = outcome[0]
    if not done:
        raise value
    result: T = value
    return result


def render_value(value: Any, context: Mapping[str, Any], path: FieldPath = ()) -> Any:
    """A copy of `value` with every templated string inside its dicts and lists evaluated.

    Raises TemplateFailure naming the path of the first string that failed.
    """
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            return render_string(value, context)
        # Any error at all: a template may divide by zero or call a method that raises,
        # and that is the operator's mistake to be reported, never a crash of the engine.
        except Exception as exc:
            raise TemplateFailure(path, exc) from exc
    if isinstance(value, dict):
        return {key: render_value(item, context, (*path, key)) for key, item in value.items()}
    if isinstance(value, list):
        return [render_value(item, context, (*path, index)) for index, item in enumerate(value)]
    return value


def _plain(value: Any) -> Any:
    """An expression's value as plain data: what pydantic and the JSON column can hold."""
    if isinstance(value, Undefined):
        # An expression returns an undefined name instead of raising; turning it into a
        # string is what makes StrictUndefined (or an unsafe-attribute marker) raise.
        str(value)
        raise UndefinedError("undefined value")  # pragma: no cover - str() raised above
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    # Jinja's filters hand back generators and views (`map`, `select`, `dict.items()`);
    # a step's parameters must be concrete lists.
    if isinstance(value, list | tuple | set | frozenset | range | KeysView | ValuesView | ItemsView | Iterator):
        return [_plain(item) for item in value]
    return value


# A run is rendered before its row, and so its id, exists: `run.id` renders as this
# marker, which each step's parameters trade for the id (as text) when its phase begins.
RUN_ID = "@@roadie:run.id@@"


def template_context(params: Mapping[str, Any], *, event_id: str, title: str, run_id: int | None) -> dict[str, Any]:
    """What a template sees: each param by name, `params`, `event` and `run`."""
    return {
        **params,
        "params": dict(params),
        "event": {"id": event_id, "title": title},
        "run": {"id": RUN_ID if run_id is None else run_id},
    }


def fill_run_id(value: Any, run_id: int) -> Any:
    """`value` with the run's id written in wherever `{{ run.id }}` rendered. It is text, as
    the marker was when the step's parameters were checked: a parameter that must be a
    number cannot take it (the start says so)."""
    if isinstance(value, str):
        return value.replace(RUN_ID, str(run_id)) if RUN_ID in value else value
    if isinstance(value, list):
        return [fill_run_id(v, run_id) for v in value]
    if isinstance(value, dict):
        return {k: fill_run_id(v, run_id) for k, v in value.items()}
    return value


def describe_template_error(error: Exception) -> str:
    """An operator's sentence for why a template failed."""
    if isinstance(error, SecurityError):
        return f"template refused by the sandbox: {error}"
    if isinstance(error, TemplateSyntaxError):
        return f"template syntax error: {error.message}"
    if isinstance(error, UndefinedError):
        return f"template failed: {error.message}"
    return f"template failed: {type(error).__name__}: {error}"


def field_path(path: Iterable[str | int]) -> str:
    """A path as an operator reads it: `phases[1].steps[0].action`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            # pydantic's marker for "the key itself, not its value"; the path already
            # ends with the key.
            continue
        else:
            text += f".{part}" if text else str(part)
    return text


def suggest(wrong: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` when a known name is close to `wrong`, else ``."""
    close = difflib.get_close_matches(wrong, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def accepted_keys(model: type[BaseModel]) -> dict[str, str]:
    """Every key a model accepts, mapped to the name an operator should write (its alias)."""
    config = model.model_config
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    keys: dict[str, str] = {}
    for name, info in model.model_fields.items():
        written = info.alias or name
        keys[written] = written
        if by_name or info.alias is None:
            keys[name] = written
    return keys


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds directly, looking through `X | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def model_at(root: type[BaseModel], path: FieldPath) -> type[BaseModel] | None:
    """The model whose mapping sits at `path` below `root`, or None when it is not a model."""
    annotation: Any = root
    for part in path:
        model = _model_in(annotation)
        if model is not None:
            if not isinstance(part, str):
                return None
            name = next((n for n, f in model.model_fields.items() if part in (n, f.alias)), None)
            if name is None:
                return None
            annotation = model.model_fields[name].annotation
            continue
        origin, args = get_origin(annotation), get_args(annotation)
        if origin in (list, tuple, set, frozenset) and args:
            annotation = args[0]
        elif origin is dict and len(args) == 2:
            annotation = args[1]
        else:
            return None
    return _model_in(annotation)


def error_message(error: ErrorDetails, root: type[BaseModel]) -> str:
    """An operator's sentence for one Pydantic error found while validating `root`."""
    kind, loc = error["type"], tuple(error["loc"])
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden" and loc:
        key = str(loc[-1])
        model = model_at(root, loc[:-1])
        known = sorted(set(accepted_keys(model).values())) if model is not None else []
        return f"unknown field {key!r}{suggest(key, known)}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message


def _value_refused(schema: dict[str, Any], value: Any) -> str | None:
    """Why `value` does not fit a lease's value schema, or None."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    return None if error is None else error.message


def step_rules(
    registry: Registry,
    action: Action,
    values: Mapping[str, Any],
    timeout: float | None,
    unknown: Iterable[str] = (),
) -> list[tuple[FieldPath, str]]:
    """What a step's action would refuse whatever the world says, beyond its parameters'
    own model: a borrow of a lease no module registers, or without the target a targeted
    lease needs, or with a priority for a lease that does not stack; a `core.wait` longer
    than its step's timeout. `values` are the step's parameters as written (aliases such
    as `for` kept); the keys in `unknown` are not known yet (templates, before the run's
    params are) and are not judged. Paths are within `with:`."""
    unknown = set(unknown)
    found: list[tuple[FieldPath, str]] = []
    if action.borrows and isinstance(values.get("lease"), str):
        try:
            lease = registry.lease(values["lease"])
        except UnknownLease as exc:
            return [(("lease",), exc.message)]
        if "target" not in unknown:
            target = values.get("target")
            if lease.targeted and target is None:
                found.append((("target",), f"lease {lease.id} is targeted: say which target"))
            elif not lease.targeted and target is not None:
                found.append((("target",), f"lease {lease.id} takes no target"))
        if lease.value_schema is not None and "value" in values and "value" not in unknown:
            refused = _value_refused(lease.value_schema, values["value"])
            if refused:
                found.append((("value",), f"lease {lease.id} takes no such value: {refused}"))
        if not lease.stacks and values.get("priority") is not None and "priority" not in unknown:
            found.append(
                (("priority",), f"lease {lease.id} does not stack: a priority is only for a lease that stacks")
            )
    if action.id == "core.wait" and timeout is not None and "for" in values and "for" not in unknown:
        try:
            wait = parse_duration(values["for"])
        except ValueError:
            return found  # the action's model says why
        if wait >= timeout:
            found.append(
                (
                    ("for",),
                    f"waits {format_duration(wait)}, as long as or longer than the step's timeout "
                    f"({format_duration(timeout)}): it could never finish; raise the step's timeout",
                )
            )
    return found


def render(
    definition: EventDefinition,
    params: dict[str, Any],
    registry: Registry,
    *,
    run_id: int | None = None,
) -> FrozenDefinition:
    """Every step of `definition` with `params` substituted and validated by its action.

    `params` are the run's resolved parameters (`EventDefinition.resolve_params`). Each
    step's parameters are stored as its action's model dumps them — defaults filled in,
    aliases such as `for` kept — so what a worker dispatches is exactly what was checked
    here. Phases and steps are numbered from 0, as in the field paths of errors; a step
    without a name is called `action#seq`. All problems are collected and raised together
    as one DefinitionError whose source is the event id.
    """
    at: list[FieldPath] = [()]  # the step being rendered, for a render that runs out of time
    frozen = within(RENDER_SECONDS, lambda: _render(definition, params, registry, run_id, at))
    if frozen is None:
        message = f"templates took longer than {RENDER_SECONDS:g}s to render"
        raise DefinitionError([Problem(definition.id, None, field_path((*at[0], "with")), message)])
    return frozen


def _render(
    definition: EventDefinition, params: dict[str, Any], registry: Registry, run_id: int | None, at: list[FieldPath]
) -> FrozenDefinition:
    source = definition.id
    context = template_context(params, event_id=definition.id, title=definition.title, run_id=run_id)
    problems: list[Problem] = []
    phases: list[RenderedPhase] = []
    size = 0  # the rendered parameters so far, as JSON characters
    for phase_index, phase in enumerate(definition.phases):
        steps: list[RenderedStep] = []
        for seq, step in enumerate(phase.steps):
            where: FieldPath = ("phases", phase_index, "steps", seq)
            at[0] = where
            try:
                action = registry.action(step.action)
            except UnknownAction as exc:
                problems.append(Problem(source, None, field_path((*where, "action")), exc.message))
                continue
            rendered: dict[str, Any] = {}
            failed = False
            for key, value in step.with_.items():
                try:
                    rendered[key] = render_value(value, context, (key,))
                except TemplateFailure as failure:
                    field = field_path((*where, "with", *failure.path))
                    problems.append(Problem(source, None, field, str(failure)))
                    failed = True
            if failed:
                # Validating the rest would only repeat the failure as "field required".
                continue
            try:
                validated = action.params.model_validate(rendered)
                values = validated.model_dump(mode="json", by_alias=True)
            except ValidationError as exc:
                for error in exc.errors():
                    field = field_path((*where, "with", *error["loc"]))
                    problems.append(Problem(source, None, field, error_message(error, action.params)))
                continue
            except Exception as exc:
                # A module's own validator or serializer raising something else is still
                # a refusal of these values, not a reason to crash the run's creation.
                field = field_path((*where, "with"))
                problems.append(Problem(source, None, field, f"invalid parameters: {exc}"))
                continue
            size += json_size(values)
            if size > MAX_RUN_CHARACTERS:
                raise DefinitionError([*problems, Problem(source, None, field_path((*where, "with")), RUN_TOO_LARGE)])
            for path, message in step_rules(registry, action, values, step.timeout):
                problems.append(Problem(source, None, field_path((*where, "with", *path)), message))
            steps.append(
                RenderedStep(
                    phase=phase_index,
                    seq=seq,
                    name=step.name or f"{step.action}#{seq}",
                    action=step.action,
                    params=values,
                    retry=step.retry,
                    timeout=step.timeout,
                    on_error=step.on_error,
                )
            )
        phases.append(RenderedPhase(name=phase.name, after=phase.after, steps=steps))
    if problems:
        raise DefinitionError(problems)
    return FrozenDefinition(event=definition, params=dict(params), phases=phases)

"""The shape of an event definition, validated by Pydantic.

These models check structure only. Whether each step's action exists and whether its
`with:` fits the action's parameter schema is checked against the registry by
`roadie.definitions.loader`, which also maps every error back to its line.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from roadie.durations import Duration
from roadie.states import CleanupPolicy, OnError

ParamType = Literal["str", "int", "float", "bool", "list", "dict"]
_PY_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "list": list,
    "dict": dict,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ParamSpec(_Strict):
    """One input of an event: its type, a default, and optional bounds or choices."""

    type: ParamType = "str"
    default: Any = None
    required: bool = False
    description: str = ""
    min: float | None = None
    max: float | None = None
    choices: list[Any] | None = None

    def coerce(self, name: str, value: Any) -> Any:
        """The value as this parameter's type, or ValueError saying why not."""
        if self.type == "int" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        elif self.type == "float" and isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        elif self.type == "bool" and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("true", "yes", "on", "1"):
                value = True
            elif lowered in ("false", "no", "off", "0"):
                value = False
        elif self.type in ("list", "dict") and isinstance(value, str):
            # As given on a command line or in a form: JSON, `[1, 2]` or `{"a": 1}`.
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        expected = _PY_TYPES[self.type]
        if not isinstance(value, expected) or (self.type in ("int", "float") and isinstance(value, bool)):
            hint = " (write it as JSON)" if self.type in ("list", "dict") and isinstance(value, str) else ""
            raise ValueError(f"param {name!r} must be {self.type}{hint}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"param {name!r} must be a finite number, got {value!r}")
        number: Any = value  # only compared when min or max is set, which only numbers have
        if self.min is not None and number < self.min:
            raise ValueError(f"param {name!r} must be at least {self.min:g}, got {value!r}")
        if self.max is not None and number > self.max:
            raise ValueError(f"param {name!r} must be at most {self.max:g}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"param {name!r} must be one of {self.choices}, got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _required_without_a_default(cls, data: Any) -> Any:
        # A param with nothing to fall back on must be given, whatever `required` says:
        # left out, it was None, and a template using it failed naming no param
        # (`unsupported operand type(s) for *: 'NoneType' and 'int'`).
        if isinstance(data, dict) and data.get("default") is None:
            return {**data, "required": True}
        return data

    @model_validator(mode="after")
    def _default_fits(self) -> ParamSpec:
        if self.default is not None:
            self.coerce("default", self.default)
        return self


class RetryPolicy(_Strict):
    """How often a retryable failure is tried again, and how long to wait between tries."""

    attempts: int = Field(3, ge=1, le=100)
    backoff: Duration = 1.0
    max_backoff: Duration = 300.0
    jitter: float = Field(0.2, ge=0.0, le=1.0)

    def delay(self, attempt: int, rand: float) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based); `rand` in [0, 1)."""
        base = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        return float(base * (1 - self.jitter + 2 * self.jitter * rand))


class StepDef(_Strict):
    """One call of one action, inside a phase."""

    action: str = Field(description="the action it calls, module.action (roadie actions lists them)")
    with_: dict[str, Any] = Field(
        default_factory=dict, alias="with", description="the action's parameters; a string may be a template"
    )
    name: str | None = Field(None, description="what staff call the step; the action's name if not given")
    retry: RetryPolicy = RetryPolicy()
    timeout: Duration = 30.0
    on_error: OnError = Field(OnError.FAIL, description="fail: the run fails with the step; continue: it goes on")

    @field_validator("action")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if "." not in value:
            raise ValueError(f"action {value!r} must be 'module.action'")
        return value


class PhaseDef(_Strict):
    """Steps that run together; the next phase starts when every one of them has ended."""

    name: str = Field(min_length=1, max_length=100)
    after: Duration = 0.0
    steps: list[StepDef] = Field(min_length=1)


class CatchUp(StrEnum):
    """What a schedule does with the occurrences it missed while every worker was down."""

    LATEST = "latest"  # make one run, for the newest missed occurrence
    ALL = "all"  # make a run for every missed occurrence, oldest first
    NONE = "none"  # make none; wait for the next occurrence


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{value.isoformat()} has no time zone: write it with its offset, "
            "e.g. 2026-05-01T20:00:00Z or 2026-05-01T21:00:00+01:00"
        )
    return value


AwareTime = Annotated[datetime, AfterValidator(_aware)]


class ScheduleDef(_Strict):
    """When runs of an event are made by themselves: a cron expression read in a time
    zone, or a list of one-shot times. Each occurrence makes exactly one run."""

    cron: str | None = None
    timezone: str = "UTC"
    at: list[AwareTime] | None = Field(None, min_length=1)
    catch_up: CatchUp = CatchUp.LATEST
    params: dict[str, Any] = Field(default_factory=dict)
    starts: AwareTime | None = None  # no occurrence before this
    until: AwareTime | None = None  # nor after this

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            expression = croniter(value)
        except (ValueError, KeyError, TypeError) as exc:  # croniter's errors are ValueErrors
            raise ValueError(f"{value!r} is not a cron expression: {exc}") from None
        try:
            expression.get_next(datetime)
        except ValueError:
            raise ValueError(f"{value!r} never falls on a real date") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _zone_exists(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            close = difflib.get_close_matches(value, sorted(available_timezones()), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else " (write an IANA name, e.g. Europe/London)"
            raise ValueError(f"unknown time zone {value!r}{hint}") from None
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ScheduleDef:
        if (self.cron is None) == (self.at is None):
            raise ValueError("a schedule takes either `cron` or `at`" + (", not both" if self.cron else ""))
        if self.at is not None and self.timezone != "UTC":
            raise ValueError("`timezone` is for `cron`; each `at` time carries its own offset")
        if self.starts is not None and self.until is not None and self.until <= self.starts:
            raise ValueError("`until` must be after `starts`")
        return self


class EventDefinition(_Strict):
    """A validated event: what an operator wrote, before any parameter is substituted."""

    id: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,99}$",
        description="the event's name; a new file of the same id is its next version",
    )
    title: str = Field("", max_length=200)
    description: str = Field("", max_length=20_000)  # copied into every run's frozen definition
    params: dict[str, ParamSpec] = Field(default_factory=dict, description="the inputs a run is started with")
    duration: Duration = Field(0.0, description="how long a run holds after its last phase before it ends")
    cleanup: CleanupPolicy = Field(
        CleanupPolicy.AUTO, description="auto: taken down when the run ends; manual: when someone cleans up"
    )
    phases: list[PhaseDef] = Field(min_length=1)
    schedule: ScheduleDef | None = Field(None, description="runs made by themselves: a cron expression or times")

    @field_validator("schedule")
    @classmethod
    def _schedule_params_fit(cls, value: ScheduleDef | None, info: ValidationInfo) -> ScheduleDef | None:
        # Checked now, not when the first occurrence fires at 3 a.m. with nobody watching.
        params = info.data.get("params")
        if value is None or params is None:
            return value
        try:
            _resolve_params(params, value.params)
        except ValueError as exc:
            error = InitErrorDetails(
                type=PydanticCustomError("value_error", "{reason}", {"reason": str(exc)}),
                loc=("params",),
                input=value.params,
            )
            raise ValidationError.from_exception_data("ScheduleDef", [error]) from exc
        return value

    @model_validator(mode="after")
    def _unique_phase_names(self) -> EventDefinition:
        seen: set[str] = set()
        for phase in self.phases:
            if phase.name in seen:
                raise ValueError(f"phase name {phase.name!r} is used twice")
            seen.add(phase.name)
        return self

    def resolve_params(self, given: dict[str, Any]) -> dict[str, Any]:
        """The run's parameters: given values coerced, defaults filled, unknowns refused."""
        return _resolve_params(self.params, given)


def _resolve_params(specs: dict[str, ParamSpec], given: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise ValueError(f"unknown param {unknown[0]!r} (this event takes: {', '.join(specs) or 'none'})")
    resolved: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in given:
            resolved[name] = spec.coerce(name, given[name])
        elif spec.default is not None:
            resolved[name] = spec.default
        else:  # no default: `ParamSpec` makes such a param required
            raise ValueError(f"param {name!r} is required: it has no default")
    return resolved


class RenderedStep(BaseModel):
    """A step with its parameters substituted and validated: what a run freezes."""

    model_config = ConfigDict(frozen=True)

    phase: int
    seq: int
    name: str
    action: str
    params: dict[str, Any]
    retry: RetryPolicy
    timeout: float
    on_error: OnError


class RenderedPhase(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    after: float
    steps: list[RenderedStep]


class FrozenDefinition(BaseModel):
    """What a run keeps: the definition as it was, its params, and every step rendered.

    Editing the event later never changes a run in flight, because a run reads only this.
    """

    model_config = ConfigDict(frozen=True)

    event: EventDefinition
    params: dict[str, Any]
    phases: list[RenderedPhase]

"""Event definitions: files to validated models (`load_file`, `load_definition`), and a
run's frozen copy with its parameters substituted (`render`)."""

from __future__ import annotations

from roadie.definitions.loader import load_definition, load_file
from roadie.definitions.model import (
    CatchUp,
    EventDefinition,
    FrozenDefinition,
    ParamSpec,
    PhaseDef,
    RenderedPhase,
    RenderedStep,
    RetryPolicy,
    ScheduleDef,
    StepDef,
)
from roadie.definitions.render import render

__all__ = [
    "CatchUp",
    "EventDefinition",
    "FrozenDefinition",
    "ParamSpec",
    "PhaseDef",
    "RenderedPhase",
    "RenderedStep",
    "RetryPolicy",
    "ScheduleDef",
    "StepDef",
    "load_definition",
    "load_file",
    "render",
]

"""Event definitions: files to validated models (`load_file`, `load_definition`), and a
run's frozen copy with its parameters substituted (`render`)."""

from __future__ import annotations

from roadie.definitions.loader import load_definition, load_file
from roadie.definitions.model import (
    EventDefinition,
    FrozenDefinition,
    ParamSpec,
    PhaseDef,
    RenderedPhase,
    RenderedStep,
    RetryPolicy,
    StepDef,
)
from roadie.definitions.render import render

__all__ = [
    "EventDefinition",
    "FrozenDefinition",
    "ParamSpec",
    "PhaseDef",
    "RenderedPhase",
    "RenderedStep",
    "RetryPolicy",
    "StepDef",
    "load_definition",
    "load_file",
    "render",
]

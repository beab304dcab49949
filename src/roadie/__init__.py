"""Roadie runs live events against a world other software owns, keeps a ledger of every
change, and takes back down exactly what they changed.

The public API: write a module with `Module`, load events with `load_definition`, run
them with `Engine` on a `Store`.
"""

from roadie.clock import Clock, FakeClock, SystemClock
from roadie.errors import (
    AnswerLost,
    DefinitionError,
    PermanentError,
    RetryableError,
    RoadieError,
    StepError,
)
from roadie.registry import (
    Answer,
    Call,
    LeaseCall,
    Module,
    ModuleConfig,
    Registry,
    Resource,
    RevertCall,
    RevertFailure,
    build_registry,
)
from roadie.states import CleanupStatus, Reversible, RunStatus, StepStatus

__version__ = "0.1.0"

__all__ = [
    "Answer",
    "AnswerLost",
    "Call",
    "CleanupStatus",
    "Clock",
    "DefinitionError",
    "FakeClock",
    "LeaseCall",
    "Module",
    "ModuleConfig",
    "PermanentError",
    "Registry",
    "Resource",
    "RetryableError",
    "Reversible",
    "RevertCall",
    "RevertFailure",
    "RoadieError",
    "RunStatus",
    "StepError",
    "StepStatus",
    "SystemClock",
    "build_registry",
]

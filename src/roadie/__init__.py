"""Roadie runs live events against a world other software owns, keeps a ledger of every
change, and takes back down exactly what they changed.

The public API: write a module with `Module`, load events with `load_definition`, run
them with `Engine` on a `Store`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roadie.errors import (
    AnswerLost,
    DefinitionError,
    PermanentError,
    RetryableError,
    RoadieError,
    StepError,
)
from roadie.lazy import lazy_names
from roadie.states import CleanupStatus, Reversible, RunStatus, StepStatus

if TYPE_CHECKING:
    from roadie.clock import Clock, FakeClock, SystemClock
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

__version__ = "0.1.0"

# The names from modules with libraries behind them (asyncio, pydantic, structlog) are
# imported when first used, not by `import roadie`: every `roadie.x` imports this package
# first, and the command line's `--help` should not pay a fifth of a second for them.
_LAZY = {
    **dict.fromkeys(("Clock", "FakeClock", "SystemClock"), "roadie.clock"),
    **dict.fromkeys(
        (
            "Answer",
            "Call",
            "LeaseCall",
            "Module",
            "ModuleConfig",
            "Registry",
            "Resource",
            "RevertCall",
            "RevertFailure",
            "build_registry",
        ),
        "roadie.registry",
    ),
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


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

"""The public API is what `import roadie` exports; changing it is a decision, not an accident."""

from __future__ import annotations

import roadie


def test_public_names_are_pinned() -> None:
    """`roadie.__all__` lists exactly these names, and each one is importable."""
    assert sorted(roadie.__all__) == [
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
    for name in roadie.__all__:
        assert getattr(roadie, name) is not None

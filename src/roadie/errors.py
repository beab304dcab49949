"""The exception hierarchy. Every error Roadie raises on purpose is a `RoadieError`.

A class's docstring is its default message. Errors that come from a step carry their
retry semantics on the error itself (`retryable`, `next_retry_delay`), so a module says
what it means without knowing how the engine schedules retries.
"""

from __future__ import annotations


class RoadieError(Exception):
    """Roadie failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(RoadieError):
    """The configuration is invalid."""


class DefinitionError(RoadieError):
    """An event definition is invalid.

    Carries one entry per problem, each with the file, line and field path, so a
    file with several mistakes is reported whole rather than one mistake a run.
    """

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class Problem:
    """One mistake in an event file: where it is and what is wrong."""

    __slots__ = ("field", "line", "message", "source")

    def __init__(self, source: str, line: int | None, field: str, message: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.message = message

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "line": self.line, "field": self.field, "message": self.message}


class RegistryError(RoadieError):
    """The module registry refused a registration or a lookup."""


class UnknownAction(RegistryError):
    """No registered module provides this action."""


class UnknownLease(RegistryError):
    """No registered module provides this lease."""


class StoreError(RoadieError):
    """The database refused or failed an operation. The driver's error is in `__cause__`."""


class DatabaseLost(StoreError):
    """The database this process opened is gone (its file was deleted or replaced)."""


class NotFound(RoadieError):
    """No such object."""


class InvalidState(RoadieError):
    """The object is not in a state that allows this operation."""


class PreflightRefused(InvalidState):
    """The run was not started: what it would meet in the world now would refuse it (a
    setting another run holds, a module that cannot be reached). Nothing was sent."""

    def __init__(self, obstacles: list[str], override: str = "force") -> None:
        self.obstacles = obstacles
        super().__init__(
            "run not started (nothing was sent): "
            + "; ".join(obstacles)
            + f". {override} starts it anyway, and the audit log says who did"
        )

    def saying(self, override: str) -> PreflightRefused:
        """The same refusal, naming how the surface it is shown on overrides it."""
        return PreflightRefused(self.obstacles, override)


class ClaimLost(InvalidState):
    """The claim this work was done under is no longer held (it expired and was taken over,
    or was released): the work stopped, and wrote nothing under the lost claim."""


class Superseded(ClaimLost):
    """A module refused a call because its fence is older than one it has already accepted
    for what the call changes: a newer owner of the step or the lease target has acted, so
    this owner's claim has lapsed. Nothing was done; nothing is retried under this claim.
    `mark` is the highest fence the module had accepted, where it says so."""

    def __init__(self, message: str = "", *, mark: int | None = None) -> None:
        super().__init__(message)
        self.mark = mark


class HandedBack(RoadieError):
    """Work this process held was given back unfinished, for another to carry on with at
    once: the process is stopping. What it did is recorded; nothing is left half done."""


class StepError(RoadieError):
    """A step failed. Whether it is retried is said by the error itself."""

    retryable: bool = True

    def __init__(
        self,
        message: str | None = None,
        *,
        retryable: bool | None = None,
        next_retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable
        self.next_retry_delay = next_retry_delay


class RetryableError(StepError):
    """The step failed for a reason that may pass; it will be retried under the same key."""

    retryable = True


class PermanentError(StepError):
    """The step failed for a reason a retry cannot fix."""

    retryable = False


class AnswerLost(RetryableError):
    """The module may have acted, but its answer never arrived."""


class StepTimeout(RetryableError):
    """The step did not answer within its timeout."""


class LeaseHeld(PermanentError):
    """The lease's target is already borrowed by another run."""

    def __init__(self, target: str, holder_run_id: int) -> None:
        self.target = target
        self.holder_run_id = holder_run_id
        super().__init__(f"{target} is already held by run {holder_run_id}")


class MalformedAnswer(RoadieError):
    """A module answered with something that is not a valid answer."""

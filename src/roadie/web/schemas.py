"""The API's request bodies and the answers only the API gives, as Pydantic models; what
it answers of Roadie's objects is `roadie.views`, shared with the CLI's `--json`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from roadie.views import (
    AuditEntry,
    CleanupReport,
    Event,
    EventDetail,
    Lease,
    Model,
    PlannedCall,
    PreviewGroup,
    Resource,
    Run,
    Schedule,
    Step,
    Token,
    Worker,
)
from roadie.web.tokens import Role

__all__ = [
    "AuditEntry",
    "CleanupReport",
    "Event",
    "EventDetail",
    "Lease",
    "PlannedCall",
    "PreviewGroup",
    "Resource",
    "Run",
    "Schedule",
    "Step",
    "Token",
    "Worker",
]


class ErrorBody(Model):
    error: str
    field: str | None = None
    problems: list[dict[str, Any]] | None = None


class EventCheck(Model):
    """What storing a valid event file would do; nothing was stored."""

    event_id: str
    phases: int
    steps: int
    version: int = Field(
        description="the version storing it would make (the newest, when it defines the same event as that one)"
    )
    current: int = Field(description="the event's newest stored version; 0 when the event is new")
    message: str
    changes: list[str] = Field(
        description="what it changes from the newest stored version, as a unified diff's lines; empty for a new event"
    )


class RunPage(Model):
    items: list[Run]
    total: int
    limit: int
    offset: int


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event: str = Field(min_length=1, max_length=100, description="The event's id.")
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="A stored version; default the newest.")
    params: dict[str, Any] = Field(default_factory=dict)
    force: bool = Field(
        False,
        description="Start even though pre-flight found a setting another run holds or a module offline "
        "(the 409 names it); audited as run.force.",
    )


class RunParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any] = Field(default_factory=dict)


class StartRuns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event: str = Field(min_length=1, max_length=100, description="The event's id.")
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="A stored version; default the newest.")
    runs: list[RunParams] = Field(min_length=1, max_length=1000, description="One entry per run, with its params.")
    force: bool = Field(
        False,
        description="Start even though pre-flight found a setting another run holds or a module offline "
        "(the 409 names it); audited as run.force.",
    )


class CancelAnswer(Model):
    run_id: int
    cancel_requested: bool


class StartCleanup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    member_key: str | None = Field(None, min_length=1, max_length=190, description="Only this memberKey's resources.")
    again: bool = Field(
        False, description="Clean up again even if cleanup is pending (it is implied after `complete` or `incomplete`)."
    )
    confirm: bool = Field(
        False, description="Go ahead though a module has more to revert than its cap (the run is `held`); audited."
    )


class Forget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=500)


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Role


class MintedToken(Token):
    token: str = Field(description="The token itself. Shown once; only its hash is kept.")


class Me(Model):
    name: str
    role: str
    via: str

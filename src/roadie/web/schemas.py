"""The API's bodies, as Pydantic models: what `/openapi.json` documents."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from roadie.web.tokens import Role


class Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ErrorBody(Model):
    error: str
    field: str | None = None
    problems: list[dict[str, Any]] | None = None


class EventCheck(Model):
    """What storing a valid event file would do; nothing was stored."""

    event_id: str
    phases: int
    steps: int
    version: int = Field(description="the version storing it would make")
    message: str


class Event(Model):
    id: int
    event_id: str
    version: int
    title: str
    created_at: datetime
    created_by: str


class EventDetail(Event):
    definition: dict[str, Any]
    source: str


class Run(Model):
    id: int
    event_id: str
    event_version: int
    title: str
    params: dict[str, Any]
    status: str
    cleanup_policy: str
    cleanup_status: str = Field(
        description="not_required, pending, complete, incomplete, or rolled_back (the world was found partially "
        "rolled back; the workers clean up again by themselves)"
    )
    phase: int
    cancel_requested: bool
    error: str | None
    created_at: datetime
    created_by: str
    started_at: datetime | None
    ended_at: datetime | None
    cleanup_attempts: int
    cleanup_started_at: datetime | None
    cleanup_ended_at: datetime | None
    cleanup_report: dict[str, Any] | None = Field(
        description="The last cleanup's report; its `verdict` (verified_clean, partially_rolled_back, unverified) "
        "and `verification` say what reading the world back found"
    )
    schedule_key: str | None = None


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


class RunParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any] = Field(default_factory=dict)


class StartRuns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event: str = Field(min_length=1, max_length=100, description="The event's id.")
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="A stored version; default the newest.")
    runs: list[RunParams] = Field(min_length=1, max_length=1000, description="One entry per run, with its params.")


class CancelAnswer(Model):
    run_id: int
    cancel_requested: bool


class Step(Model):
    id: int
    run_id: int
    phase: int
    seq: int
    name: str
    action: str
    owner: str
    reversible: str
    idempotency_key: str
    status: str
    attempts: int
    max_attempts: int
    not_before: datetime
    started_at: datetime | None
    ended_at: datetime | None
    error: str | None
    output: Any = None
    rejections: list[str] | None
    attempt_log: list[dict[str, Any]] | None


class Resource(Model):
    id: int
    run_id: int
    step_id: int | None
    owner: str
    kind: str
    ref: str
    payload: Any = None
    until: datetime | None
    member_key: str | None
    state: str
    created_at: datetime
    updated_at: datetime
    reverted_at: datetime | None
    attempts: int
    error: str | None


class PlannedCall(Model):
    kind: str
    step_id: int | None
    step: str
    action: str
    idempotency_key: str
    resources: list[dict[str, Any]]
    row_ids: list[int]


class StartCleanup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    member_key: str | None = Field(None, min_length=1, max_length=190, description="Only this memberKey's resources.")
    again: bool = Field(
        False, description="Clean up again even if cleanup is pending (it is implied after `complete` or `incomplete`)."
    )
    confirm: bool = Field(
        False, description="Go ahead though a module has more to revert than its cap (the run is `held`); audited."
    )


class PreviewGroup(Model):
    module: str
    kind: str
    count: int
    newest: list[str] = Field(description="The newest few, in the world's words")
    cap: int | None
    over_cap: bool = Field(description="The module has more to revert than its cap: a cleanup waits for a confirm")


class CleanupReport(Model):
    run_id: int
    status: str
    member_key: str | None
    calls: int
    reverted: int
    restored: int
    failed: int
    left_alone: int = Field(description="Borrowed values someone set to another value since: not written over")
    verdict: str = Field(description="verified_clean, partially_rolled_back or unverified")
    verification: dict[str, Any] = Field(
        description="What reading the world back found: counts (inspected, gone, came_back, still_there, "
        "not_inspected, unverifiable, foreign, changed) and the first findings by name"
    )
    late: list[dict[str, Any]] = Field(description="The run's end, its cleanup or a lease given back long after due")
    over_cap: dict[str, Any] = Field(description="By module: more to revert than its cap (held, or confirmed)")
    errors: list[dict[str, Any]]
    forgotten: list[dict[str, Any]]


class Forget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=500)


class Lease(Model):
    resource_id: int
    run_id: int
    target: str
    state: str
    saved: Any = None
    priority: int | None = Field(None, description="a layer of a lease that stacks: its priority")
    value: Any = Field(None, description="a layer of a lease that stacks: the value it asks the world to show")
    until: datetime | None


class Schedule(Model):
    event_id: str
    version: int
    schedule: dict[str, Any]
    last_occurrence: datetime | None
    next_occurrence: datetime | None


class AuditEntry(Model):
    id: int
    at: datetime
    actor: str
    action: str
    subject: str
    detail: Any = None


class Worker(Model):
    worker_id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    concurrency: int
    version: str
    state: str
    steps: int
    cleanups: int


class Token(Model):
    id: int
    key: str
    name: str
    role: str
    created_at: datetime
    created_by: str
    revoked_at: datetime | None


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

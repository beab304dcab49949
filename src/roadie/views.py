"""What Roadie shows of each of its objects, one shape for every surface: the HTTP API's
bodies (and so `/openapi.json`) and the CLI's `--json` are both these models' JSON."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from roadie.engine.leases import stack_ref
from roadie.states import LAYER_KIND
from roadie.store.rows import ResourceRow


class Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


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
    phase_due_at: datetime | None = Field(None, description="When the next phase may start (its `after:`)")
    ends_at: datetime | None = Field(None, description="When the run's hold ends, once its last phase is done")
    cleanup_claimed_by: str | None = Field(None, description="The worker cleaning the run up now, if one is")


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
    params: dict[str, Any] = Field(default_factory=dict, description="The step's parameters, as rendered")
    timeout: float | None = None
    on_error: str | None = None
    status: str
    claimed_by: str | None = Field(None, description="The worker carrying the step out now, if one is")
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
    held: int = Field(0, description="Lease rows the expiry sweeper was giving back when the cleanup came to them")
    verdict: str = Field(description="verified_clean, partially_rolled_back or unverified")
    verification: dict[str, Any] = Field(
        description="What reading the world back found: counts (inspected, gone, came_back, still_there, "
        "not_inspected, unverifiable, foreign, changed) and the first findings by name"
    )
    late: list[dict[str, Any]] = Field(description="The run's end, its cleanup or a lease given back long after due")
    over_cap: dict[str, Any] = Field(description="By module: more to revert than its cap (held, or confirmed)")
    errors: list[dict[str, Any]]
    forgotten: list[dict[str, Any]]


class Lease(Model):
    resource_id: int
    run_id: int
    target: str
    state: str
    saved: Any = None
    priority: int | None = Field(None, description="a layer of a lease that stacks: its priority")
    value: Any = Field(None, description="a layer of a lease that stacks: the value it asks the world to show")
    until: datetime | None

    @classmethod
    def of(cls, row: ResourceRow) -> Lease:
        """A lease row (an override, or a layer of a lease that stacks) as a lease in force."""
        payload = row.payload if isinstance(row.payload, dict) else {}
        layered = row.kind == LAYER_KIND
        return cls(
            resource_id=row.id,
            run_id=row.run_id,
            target=stack_ref(row),
            state=row.state,
            saved=payload.get("saved"),
            priority=payload.get("priority") if layered else None,
            value=payload.get("value") if layered else None,
            until=row.until,
        )


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


M = TypeVar("M", bound=BaseModel)


def shown(model: type[M], thing: Any) -> dict[str, Any]:
    """`thing` (a row, a report, a dict) as `model` shows it, ready for JSON."""
    return model.model_validate(thing).model_dump(mode="json")


def shown_all(model: type[M], things: Iterable[Any]) -> list[dict[str, Any]]:
    return [shown(model, t) for t in things]

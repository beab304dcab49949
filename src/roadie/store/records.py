"""What the engine hands the store and gets back: steps to insert, claims, answers, moves."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from roadie.states import Reversible, RunStatus, StepStatus
from roadie.store.rows import EventRow, ResourceRow, RunRow, StepRow


@dataclass
class NewStep:
    """A step as materialise inserts it."""

    phase: int
    seq: int
    name: str
    action: str
    owner: str
    reversible: Reversible
    lease_ref: str | None
    params: dict[str, Any]
    idempotency_key: str
    max_attempts: int
    retry: dict[str, Any]
    timeout: float
    on_error: str


@dataclass
class NewResource:
    """A resource a module reported, already checked by the ledger's rules."""

    kind: str
    ref: str
    payload: Any = None
    until: datetime | None = None
    member_key: str | None = None


@dataclass
class Claimed:
    """A claimed step. Its ledger row (placeholder or lease) is reserved before dispatch;
    `reserved_id` names the lease row, which the borrow writes its saved value into."""

    step: StepRow
    reserved_id: int | None = None
    refused: str | None = None  # set when the reservation was refused: the step was failed
    fence: int = 0  # minted with the claim: every call made for the step carries it


@dataclass
class Outcome:
    """What happened to one dispatch, as the drain records it."""

    step: StepRow
    status: StepStatus  # SUCCEEDED, FAILED, or READY for a retry
    at: datetime
    output: Any = None
    error: str | None = None
    not_before: datetime | None = None
    resources: list[NewResource] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    resolve_placeholder: bool = False
    lease_until: datetime | None = None
    confirm_lease: bool = False
    started: datetime | None = None  # when this attempt was dispatched, for the timeline
    recorded: int = 0  # filled in by the store: rows this run now holds for the step
    stale: bool = False  # set by the store: the attempt's claim was lost, nothing was recorded


@dataclass
class RunMove:
    """One run moved on by the engine: phase begun, steps inserted, held, ended or failed.

    Applied with a guard on the run's state as it was read, so a second worker holding
    the same stale view moves nothing.
    """

    run: RunRow
    phase: int | None = None
    materialised_phase: int | None = None
    phase_due_at: datetime | None = None
    ends_at: datetime | None = None
    steps: list[NewStep] = field(default_factory=list)
    finish: RunStatus | None = None
    skip_ready: bool = False
    fail: str | None = None  # the run cannot go on: stop it, and it ends failed


@dataclass
class PhaseCounts:
    """A run in flight, with the steps of its current phase still to end."""

    run: RunRow
    ready: int
    running: int


def mint_token(incarnation: str) -> str:
    """A claim token: the holder's incarnation (one process's engine), then a part that
    is new for every claim, so no two attempts ever share one (DESIGN §11)."""
    return f"{incarnation}.{secrets.token_hex(8)}"


@dataclass(frozen=True)
class CleanupClaim:
    """A run's cleanup as one owner holds it: every write it makes names `token`, and
    pushes the claim's expiry `ttl` seconds on, so a cleanup that makes progress keeps it
    and one stuck on a module loses it."""

    run_id: int
    token: str
    ttl: float
    fence: int = 0  # minted when the claim was taken: the cleanup's reverts carry it


@dataclass(frozen=True)
class NewRun:
    """A run to create: an event's definition rendered with its params and frozen."""

    event: EventRow
    definition: dict[str, Any]
    params: dict[str, Any]
    cleanup_policy: str
    first_phase_due: datetime
    # One occurrence of the event's schedule: the database keeps one run per key.
    schedule_key: str | None = None
    # What pre-flight found in its way and the starter overrode (force): audited as `run.force`.
    overridden: list[dict[str, Any]] | None = None
    # What pre-flight found in the way of a schedule's run: it is made failed with this
    # error (ended by the next advance, before any step), and audited as `run.refused`.
    refused: str | None = None


@dataclass
class LiveGroup:
    """What a run still holds of one kind from one module: how many, and the newest few."""

    owner: str
    kind: str
    count: int
    newest: list[ResourceRow]

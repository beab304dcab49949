"""Typed views of the rows the store hands out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from operator import itemgetter
from typing import Any, TypeVar

from sqlalchemy import Result, Row

T = TypeVar("T")


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    # dataclasses.fields() builds its answer anew on every call; rows are made by the thousand.
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def from_rows(cls: type[T], rows: Result[Any] | Sequence[Row[Any]], **overrides: Any) -> list[T]:
    """`cls` from each row's columns of the same names; `overrides` for columns not selected.

    The columns are found once for all the rows, and each object is made by filling its
    `__dict__` at once: the classes below are frozen dataclasses with no `__post_init__`,
    whose `__init__` sets each field through `object.__setattr__` and costs twice as much
    again as looking the values up by name, which costs three times this."""
    keys: Iterable[str]
    if isinstance(rows, Result):
        keys = rows.keys()
    elif rows:
        keys = rows[0]._fields
    else:
        return []
    index = {key: i for i, key in enumerate(keys)}
    selected = [name for name in _names(cls) if name not in overrides]
    missing = [name for name in selected if name not in index]
    if missing:
        raise KeyError(f"{cls.__name__}: no column {', '.join(missing)}")
    pick = itemgetter(*(index[name] for name in selected))
    single = len(selected) == 1
    made = []
    for row in rows:
        obj = object.__new__(cls)
        values = obj.__dict__
        values.update(zip(selected, (pick(row),) if single else pick(row), strict=True))
        values.update(overrides)
        made.append(obj)
    return made


def from_row(cls: type[T], row: Row[Any], **overrides: Any) -> T:
    """`cls` from a row's columns of the same names; `overrides` for columns not selected."""
    mapping = row._mapping
    obj = object.__new__(cls)
    obj.__dict__.update((name, overrides[name] if name in overrides else mapping[name]) for name in _names(cls))
    return obj


@dataclass(frozen=True)
class EventRow:
    id: int
    event_id: str
    version: int
    title: str
    definition: dict[str, Any]
    source: str
    created_at: datetime
    created_by: str


@dataclass(frozen=True)
class RunRow:
    id: int
    nonce: str
    event_id: str
    event_version: int
    title: str
    definition: dict[str, Any]
    params: dict[str, Any]
    status: str
    cleanup_policy: str
    cleanup_status: str
    phase: int
    materialised_phase: int
    phase_due_at: datetime | None
    ends_at: datetime | None
    cancel_requested: bool
    error: str | None
    created_at: datetime
    created_by: str
    started_at: datetime | None
    ended_at: datetime | None
    cleanup_claimed_by: str | None
    cleanup_claim_expires: datetime | None
    cleanup_attempts: int
    cleanup_started_at: datetime | None
    cleanup_ended_at: datetime | None
    cleanup_report: dict[str, Any] | None
    schedule_key: str | None = None  # set on a run a schedule made: its occurrence
    cleanup_token: str | None = None


@dataclass(frozen=True)
class ScheduleRow:
    """Where one event's schedule stands: its newest occurrence already made or skipped."""

    id: int
    event_id: str
    last_occurrence: datetime
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class StepRow:
    id: int
    run_id: int
    phase: int
    seq: int
    name: str
    action: str
    owner: str
    reversible: str
    lease_ref: str | None
    params: dict[str, Any]
    idempotency_key: str
    status: str
    attempts: int
    max_attempts: int
    retry: dict[str, Any]
    timeout: float
    on_error: str
    not_before: datetime
    claimed_by: str | None
    claim_expires: datetime | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    error: str | None
    output: Any
    rejections: list[str] | None
    attempt_log: list[dict[str, Any]] | None
    claim_token: str | None = None

    @property
    def layered(self) -> bool:
        """A borrow of a lease that stacks: its params name its layer's priority."""
        return self.lease_ref is not None and self.params.get("priority") is not None


@dataclass(frozen=True)
class ResourceRow:
    id: int
    run_id: int
    step_id: int | None
    owner: str
    kind: str
    ref: str
    payload: Any
    until: datetime | None
    member_key: str | None
    state: str
    created_at: datetime
    updated_at: datetime
    reverted_at: datetime | None
    attempts: int
    error: str | None
    claim_token: str | None = None
    claim_expires: datetime | None = None


@dataclass(frozen=True)
class AuditRow:
    id: int
    at: datetime
    actor: str
    action: str
    subject: str
    detail: Any


@dataclass(frozen=True)
class WorkerRow:
    """A worker with what it holds now: running steps and cleanups claimed in its name."""

    worker_id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    concurrency: int
    version: str
    state: str  # a WorkerState
    steps: int
    cleanups: int


@dataclass(frozen=True)
class TokenRow:
    """An API token as stored: never its secret, only the secret's hash."""

    id: int
    key: str
    name: str
    role: str
    secret_hash: str
    created_at: datetime
    created_by: str
    revoked_at: datetime | None


@dataclass(frozen=True)
class SessionRow:
    """A dashboard session with the token it was opened with."""

    id: int
    token_id: int
    csrf: str
    created_at: datetime
    expires_at: datetime
    token: TokenRow

"""Every SQL statement of the system, one named method each, verb first.

The engine talks to the database only through `Store`. Methods that change state run in
one transaction each; the ones the drain calls take whole batches, so a worker pays one
commit for many steps.

`write_point` is the fault hook of the crash tests: it is called with a name just before
each write transaction commits, and whatever it raises aborts that transaction.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    delete,
    func,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from roadie.errors import InvalidState, NotFound, StoreError
from roadie.states import (
    OVERRIDE_KIND,
    STEP_KIND,
    CleanupStatus,
    ResourceState,
    Reversible,
    RunStatus,
    StepStatus,
    WorkerState,
)
from roadie.store import dialects, migrate
from roadie.store.rows import (
    AuditRow,
    EventRow,
    ResourceRow,
    RunRow,
    ScheduleRow,
    SessionRow,
    StepRow,
    TokenRow,
    WorkerRow,
    from_row,
)
from roadie.store.tables import (
    LIVE_STATES,
    UTCDateTime,
    api_tokens,
    audit,
    events,
    run_resources,
    runs,
    schedules,
    steps,
    web_sessions,
    workers,
)

log = structlog.get_logger(__name__)

WritePoint = Callable[[str], None]
TRANSIENT_ATTEMPTS = 8
# Lost connections are tried again for about ten seconds (pauses of 0.05 s doubling up to
# 2 s): long enough for a database server to restart, short enough to report a dead one.
CONNECTION_ATTEMPTS = 10
RECONNECT_MAX_DELAY = 2.0
_CHUNK = 400  # bound on bind parameters per statement, well inside every database's limit


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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


class Store:
    def __init__(self, engine: AsyncEngine, *, write_point: WritePoint | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.write_point: WritePoint = write_point or (lambda name: None)
        self.active = 0  # database calls under way, for callers (tests) that must know

    @classmethod
    async def open(cls, url: str, *, migrate_schema: bool = True, **kwargs: Any) -> Store:
        """Open the database at `url`, applying migrations first unless told not to."""
        engine = dialects.create_engine(url, **kwargs)
        store = cls(engine)
        if migrate_schema:
            await store.migrate()
        return store

    async def migrate(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(migrate.upgrade)

    async def close(self) -> None:
        await self.engine.dispose()

    # -- plumbing -------------------------------------------------------------------

    async def _write(self, name: str, work: Callable[[AsyncConnection], Any]) -> Any:
        """Run `work` in one write transaction, passing the named write point before commit.

        A deadlock or serialisation failure is the database asking for the transaction
        again; it is run again, a few times, before it becomes a `StoreError`. So is a
        connection lost before the commit was sent (the server restarted, the backend was
        killed): nothing of the transaction was kept, and a new connection is tried with
        a growing pause, for as long as a server restart takes. A connection lost *during*
        the commit is not run again: whether it committed is unknown, and the caller (who
        knows whether doing it twice is harmless) decides.
        """
        attempt = lost = 0
        while True:
            committing = False
            try:
                self.active += 1
                async with self.engine.connect() as conn:
                    async with conn.begin():
                        result = await work(conn)
                        self.write_point(name)
                        committing = True
                    return result
            except DBAPIError as exc:
                if not committing and lost < CONNECTION_ATTEMPTS and dialects.is_connection_lost(self.dialect, exc):
                    lost += 1
                    await self._reconnect_pause(name, lost, exc)
                    continue
                attempt += 1
                if attempt < TRANSIENT_ATTEMPTS and dialects.is_transient(self.dialect, exc):
                    # Jittered, so that the workers that deadlocked do not meet again.
                    await asyncio.sleep(random.uniform(0, 0.02 * attempt))
                    continue
                if committing and dialects.is_connection_lost(self.dialect, exc):
                    raise StoreError(f"{name}: the connection was lost while committing: {exc.orig}") from exc
                raise StoreError(f"{name}: {exc.orig}") from exc
            finally:
                self.active -= 1

    async def _read(self, work: Callable[[AsyncConnection], Any]) -> Any:
        lost = 0
        while True:
            self.active += 1
            try:
                async with self.engine.connect() as conn:
                    return await work(conn)
            except DBAPIError as exc:
                # A read changes nothing: after a lost connection it is always safe again.
                if lost < CONNECTION_ATTEMPTS and dialects.is_connection_lost(self.dialect, exc):
                    lost += 1
                    await self._reconnect_pause("read", lost, exc)
                    continue
                raise StoreError(str(exc.orig)) from exc
            finally:
                self.active -= 1

    async def _reconnect_pause(self, name: str, lost: int, exc: DBAPIError) -> None:
        delay = min(RECONNECT_MAX_DELAY, 0.05 * 2 ** (lost - 1)) * random.uniform(0.5, 1.0)
        log.warning("database connection lost; reconnecting", write=name, attempt=lost, error=str(exc.orig)[:200])
        await asyncio.sleep(delay)

    # -- events ---------------------------------------------------------------------

    async def create_event_version(
        self, event_id: str, title: str, definition: dict[str, Any], source: str, actor: str, now: datetime
    ) -> EventRow:
        """Store a new version of an event, or answer the newest one if it is identical."""

        async def work(conn: AsyncConnection) -> EventRow:
            latest = (
                await conn.execute(
                    select(events).where(events.c.event_id == event_id).order_by(events.c.version.desc()).limit(1)
                )
            ).first()
            if latest is not None and latest.definition == definition:
                return from_row(EventRow, latest)
            version = (latest.version + 1) if latest is not None else 1
            row = (
                await conn.execute(
                    events.insert()
                    .values(
                        event_id=event_id,
                        version=version,
                        title=title,
                        definition=definition,
                        source=source,
                        created_at=now,
                        created_by=actor,
                    )
                    .returning(*events.c)
                )
            ).one()
            await self._audit(conn, now, actor, "event.apply", f"event:{event_id}", {"version": version})
            return from_row(EventRow, row)

        result: EventRow = await self._write("create_event_version", work)
        return result

    async def get_event(self, event_id: str, version: int | None = None) -> EventRow:
        query = select(events).where(events.c.event_id == event_id)
        query = query.where(events.c.version == version) if version else query.order_by(events.c.version.desc())

        async def work(conn: AsyncConnection) -> EventRow:
            row = (await conn.execute(query.limit(1))).first()
            if row is None:
                raise NotFound(f"no event {event_id!r}" + (f" version {version}" if version else ""))
            return from_row(EventRow, row)

        result: EventRow = await self._read(work)
        return result

    async def list_events(self) -> list[EventRow]:
        newest = select(events.c.event_id, func.max(events.c.version).label("v")).group_by(events.c.event_id).subquery()
        query = (
            select(events)
            .join(newest, and_(events.c.event_id == newest.c.event_id, events.c.version == newest.c.v))
            .order_by(events.c.event_id)
        )

        async def work(conn: AsyncConnection) -> list[EventRow]:
            return [from_row(EventRow, r) for r in await conn.execute(query)]

        result: list[EventRow] = await self._read(work)
        return result

    # -- runs -----------------------------------------------------------------------

    async def create_run(
        self,
        *,
        event: EventRow,
        definition: dict[str, Any],
        params: dict[str, Any],
        cleanup_policy: str,
        first_phase_due: datetime,
        actor: str,
        now: datetime,
        schedule_key: str | None = None,
    ) -> RunRow | None:
        """Insert a run. With a `schedule_key` (one occurrence of a schedule) the database
        keeps at most one run per key: when the key is taken, another worker made this
        occurrence's run already, nothing is inserted, and the answer is None."""

        nonce = secrets.token_hex(6)

        async def work(conn: AsyncConnection) -> RunRow | None:
            values = dict(
                nonce=nonce,
                event_id=event.event_id,
                event_version=event.version,
                title=event.title,
                definition=definition,
                params=params,
                status=RunStatus.PENDING.value,
                cleanup_policy=cleanup_policy,
                cleanup_status=CleanupStatus.NOT_REQUIRED.value,
                phase=0,
                materialised_phase=-1,
                phase_due_at=first_phase_due,
                cancel_requested=False,
                created_at=now,
                created_by=actor,
                cleanup_attempts=0,
                schedule_key=schedule_key,
            )
            if schedule_key is None:
                row = (await conn.execute(runs.insert().values(**values).returning(*runs.c))).one()
            else:
                # The key's unique constraint decides; the nonce says whether this insert
                # is the one that won. (No savepoint and no RETURNING on a conflict: both
                # behave differently on each database.)
                await conn.execute(dialects.insert_ignore(self.dialect, runs).values(**values))
                row = (await conn.execute(select(runs).where(runs.c.schedule_key == schedule_key))).one()
                if row.nonce != nonce:  # this occurrence's run exists: another worker made it
                    return None
            detail: dict[str, Any] = {"event": event.event_id, "params": params}
            if schedule_key is not None:
                detail["schedule_key"] = schedule_key
            await self._audit(conn, now, actor, "run.start", f"run:{row.id}", detail)
            return from_row(RunRow, row)

        result: RunRow | None = await self._write("create_run", work)
        return result

    async def get_run(self, run_id: int) -> RunRow:
        async def work(conn: AsyncConnection) -> RunRow:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
            if row is None:
                raise NotFound(f"no run {run_id}")
            return from_row(RunRow, row)

        result: RunRow = await self._read(work)
        return result

    async def list_runs(
        self, *, status: str | None = None, event_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[RunRow]:
        query = select(runs).order_by(runs.c.id.desc()).limit(limit).offset(offset)
        if status:
            query = query.where(runs.c.status == status)
        if event_id:
            query = query.where(runs.c.event_id == event_id)

        async def work(conn: AsyncConnection) -> list[RunRow]:
            return [from_row(RunRow, r) for r in await conn.execute(query)]

        result: list[RunRow] = await self._read(work)
        return result

    async def request_cancel(self, run_id: int, actor: str, now: datetime) -> bool:
        """Stop new dispatches of a run. In-flight steps answer; the run then ends cancelled."""

        async def work(conn: AsyncConnection) -> bool:
            changed = await conn.execute(
                update(runs)
                .where(
                    runs.c.id == run_id,
                    runs.c.status.in_([RunStatus.PENDING.value, RunStatus.RUNNING.value]),
                    runs.c.cancel_requested.is_(False),
                )
                .values(cancel_requested=True)
            )
            if changed.rowcount:
                await self._skip_ready_steps(conn, [run_id], now, "run cancelled")
                await self._audit(conn, now, actor, "run.cancel", f"run:{run_id}", None)
            return bool(changed.rowcount)

        result: bool = await self._write("request_cancel", work)
        return result

    async def runs_in_flight(self, known: Container[int] = ()) -> list[PhaseCounts]:
        """Every unfinished run with how many steps of its current phase are ready and running.

        A run's definition is frozen when it is created, so a caller that has parsed it
        already names the run in `known`: its `definition` is then not read again (it is
        answered empty), which spares decoding every run's definition on every pass.
        """
        in_flight = runs.c.status.in_([RunStatus.PENDING.value, RunStatus.RUNNING.value])

        def count(status: StepStatus) -> Any:
            return func.sum(case((steps.c.status == status.value, 1), else_=0))

        counts = (
            select(
                steps.c.run_id,
                count(StepStatus.READY).label("ready"),
                count(StepStatus.RUNNING).label("running"),
            )
            .join(runs, and_(runs.c.id == steps.c.run_id, steps.c.phase == runs.c.phase))
            .where(in_flight)
            .group_by(steps.c.run_id)
            .subquery()
        )
        query = (
            select(
                *(c for c in runs.c if c.name != "definition"),
                func.coalesce(counts.c.ready, 0).label("ready"),
                func.coalesce(counts.c.running, 0).label("running"),
            )
            .select_from(runs.outerjoin(counts, counts.c.run_id == runs.c.id))
            .where(in_flight)
            .order_by(runs.c.id)
        )

        async def work(conn: AsyncConnection) -> list[PhaseCounts]:
            found = (await conn.execute(query)).all()
            definitions: dict[int, Any] = {}
            for chunk in _chunks([r.id for r in found if r.id not in known]):
                wanted = select(runs.c.id, runs.c.definition).where(runs.c.id.in_(list(chunk)))
                definitions.update((r.id, r.definition) for r in await conn.execute(wanted))
            return [
                PhaseCounts(from_row(RunRow, r, definition=definitions.get(r.id, {})), int(r.ready), int(r.running))
                for r in found
            ]

        result: list[PhaseCounts] = await self._read(work)
        return result

    async def advance_runs(self, moves: list[RunMove], now: datetime) -> None:
        """Apply the engine's moves in one transaction.

        Steps are inserted ignoring rows that exist, so materialising again after a crash
        (or by a second worker at the same moment) repairs instead of duplicating.
        """
        rows = [
            {
                "run_id": m.run.id,
                "phase": s.phase,
                "seq": s.seq,
                "name": s.name,
                "action": s.action,
                "owner": s.owner,
                "reversible": s.reversible.value,
                "lease_ref": s.lease_ref,
                "params": s.params,
                "idempotency_key": s.idempotency_key,
                "status": StepStatus.READY.value,
                "attempts": 0,
                "max_attempts": s.max_attempts,
                "retry": s.retry,
                "timeout": s.timeout,
                "on_error": s.on_error,
                "not_before": now,
                "created_at": now,
            }
            for m in moves
            for s in m.steps
        ]
        updates = [
            {
                "b_id": m.run.id,
                "b_old_phase": m.run.phase,
                "b_old_materialised": m.run.materialised_phase,
                "b_phase": m.run.phase if m.phase is None else m.phase,
                "b_materialised": m.run.materialised_phase if m.materialised_phase is None else m.materialised_phase,
                "b_due": m.phase_due_at or m.run.phase_due_at,
                "b_ends": m.ends_at or m.run.ends_at,
                "b_status": (
                    m.finish.value
                    if m.finish
                    else RunStatus.RUNNING.value
                    if m.steps or m.run.status == RunStatus.RUNNING.value
                    else m.run.status
                ),
                "b_started": m.run.started_at or (now if m.steps else None),
                "b_ended": now if m.finish else None,
            }
            for m in moves
            if m.fail is None
        ]

        async def work(conn: AsyncConnection) -> None:
            for chunk in _chunks(rows, 40):
                await conn.execute(dialects.insert_ignore(self.dialect, steps), list(chunk))
            if updates:
                await conn.execute(
                    update(runs)
                    .where(
                        runs.c.id == bindparam("b_id"),
                        runs.c.phase == bindparam("b_old_phase"),
                        runs.c.materialised_phase == bindparam("b_old_materialised"),
                        # (an IN list cannot be used with executemany)
                        or_(runs.c.status == RunStatus.PENDING.value, runs.c.status == RunStatus.RUNNING.value),
                    )
                    .values(
                        phase=bindparam("b_phase"),
                        materialised_phase=bindparam("b_materialised"),
                        phase_due_at=bindparam("b_due"),
                        ends_at=bindparam("b_ends"),
                        status=bindparam("b_status"),
                        started_at=bindparam("b_started"),
                        ended_at=bindparam("b_ended"),
                    ),
                    updates,
                )
            skip = [m.run.id for m in moves if m.skip_ready]
            if skip:
                await self._skip_ready_steps(conn, skip, now, "run stopped")
            failing = {m.run.id: m.fail for m in moves if m.fail}
            if failing:
                await self._fail_runs(conn, failing, now)

        await self._write("materialise_phase" if rows else "advance_runs", work)

    async def runs_by_ids(self, run_ids: list[int]) -> list[RunRow]:
        async def work(conn: AsyncConnection) -> list[RunRow]:
            found = {r.id: from_row(RunRow, r) for r in await conn.execute(select(runs).where(runs.c.id.in_(run_ids)))}
            missing = [i for i in run_ids if i not in found]
            if missing:
                raise NotFound(f"no run {missing[0]}")
            return [found[i] for i in run_ids]

        result: list[RunRow] = await self._read(work)
        return result

    async def _fail_runs(self, conn: AsyncConnection, errors: dict[int, str], now: datetime) -> None:
        for run_id, error in errors.items():
            await conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.error.is_(None))
                .values(error=error, cancel_requested=True)
            )
        await self._skip_ready_steps(conn, list(errors), now, "run failed")

    async def _skip_ready_steps(self, conn: AsyncConnection, run_ids: list[int], now: datetime, why: str) -> None:
        await conn.execute(
            update(steps)
            .where(steps.c.run_id.in_(run_ids), steps.c.status == StepStatus.READY.value)
            .values(status=StepStatus.SKIPPED.value, ended_at=now, error=why)
        )

    # -- schedules ------------------------------------------------------------------

    async def scheduled_events(self) -> list[tuple[EventRow, ScheduleRow | None]]:
        """The newest version of each event that has a schedule or had one (it still has a
        row here), with where its schedule stands: None when no worker has seen it yet."""
        newest = select(events.c.event_id, func.max(events.c.version).label("v")).group_by(events.c.event_id).subquery()
        query = (
            select(events)
            .join(newest, and_(events.c.event_id == newest.c.event_id, events.c.version == newest.c.v))
            .order_by(events.c.event_id)
        )

        async def work(conn: AsyncConnection) -> list[tuple[EventRow, ScheduleRow | None]]:
            standing = {r.event_id: from_row(ScheduleRow, r) for r in await conn.execute(select(schedules))}
            found = []
            for r in await conn.execute(query):
                row = standing.get(r.event_id)
                if row is not None or (r.definition or {}).get("schedule"):
                    found.append((from_row(EventRow, r), row))
            return found

        result: list[tuple[EventRow, ScheduleRow | None]] = await self._read(work)
        return result

    async def start_schedule(self, event_id: str, start: datetime, now: datetime) -> ScheduleRow:
        """Record a schedule first seen, counting its occurrences from after `start`. When
        another worker recorded it first, its row stands and is answered."""
        mine = schedules.c.event_id == event_id

        async def work(conn: AsyncConnection) -> ScheduleRow:
            insert = dialects.insert_ignore(self.dialect, schedules)
            await conn.execute(insert.values(event_id=event_id, last_occurrence=start, created_at=now, updated_at=now))
            row = (await conn.execute(select(schedules).where(mine))).one()
            return from_row(ScheduleRow, row)

        result: ScheduleRow = await self._write("start_schedule", work)
        return result

    async def advance_schedule(self, event_id: str, last_occurrence: datetime, now: datetime) -> bool:
        """Mark every occurrence up to `last_occurrence` made or skipped. Never moves back:
        a worker with an older view than another's changes nothing."""

        async def work(conn: AsyncConnection) -> bool:
            changed = await conn.execute(
                update(schedules)
                .where(schedules.c.event_id == event_id, schedules.c.last_occurrence < last_occurrence)
                .values(last_occurrence=last_occurrence, updated_at=now)
            )
            return bool(changed.rowcount)

        result: bool = await self._write("advance_schedule", work)
        return result

    async def forget_schedule(self, event_id: str) -> None:
        """The event's newest version has no schedule: drop where it stood, so a schedule
        added back later starts afresh instead of catching up on the time between."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(schedules).where(schedules.c.event_id == event_id))

        await self._write("forget_schedule", work)

    # -- the drain ------------------------------------------------------------------

    async def claim_steps(self, worker: str, now: datetime, limit: int, claim_ttl: float) -> list[Claimed]:
        """Claim up to `limit` runnable steps and reserve their ledger rows, in one transaction.

        For `ledger` steps that is the placeholder `{@step, key}`; for `override` steps the
        lease's real row. Both are committed before this returns, so every dispatch that
        follows has its durable record (DESIGN §4 rules 1 and 3). A lease whose target
        another run holds is refused here, before the world is touched: its step fails.
        """
        values = {
            "status": StepStatus.RUNNING.value,
            "claimed_by": worker,
            "claim_expires": now + timedelta(seconds=claim_ttl),
            "attempts": steps.c.attempts + 1,
            "started_at": func.coalesce(steps.c.started_at, now),
        }
        ready = [steps.c.status == StepStatus.READY.value, steps.c.not_before <= now]
        order = (steps.c.not_before, steps.c.id)

        async def work(conn: AsyncConnection) -> list[Claimed]:
            if dialects.returning_update(self.dialect):
                runnable = (
                    select(steps.c.id)
                    .join(runs, runs.c.id == steps.c.run_id)
                    .where(*ready, runs.c.cancel_requested.is_(False))
                    .order_by(*order)
                    .limit(limit)
                )
                if self.dialect == "postgresql":
                    # Rows another worker is claiming are skipped, not waited for.
                    runnable = runnable.with_for_update(skip_locked=True, of=steps)
                statement = update(steps).where(steps.c.id.in_(runnable.scalar_subquery())).values(**values)
                rows = (await conn.execute(statement.returning(*steps.c))).all()
            else:
                # MariaDB: no UPDATE ... RETURNING, and a locking read over a join would lock
                # the run's row too, so that two workers could never share one run's steps.
                stopped = [
                    r.id
                    for r in await conn.execute(
                        select(runs.c.id).where(
                            runs.c.cancel_requested.is_(True),
                            runs.c.status.in_([RunStatus.PENDING.value, RunStatus.RUNNING.value]),
                        )
                    )
                ]
                query = select(steps.c.id).where(*ready).order_by(*order).limit(limit)
                if stopped:
                    query = query.where(steps.c.run_id.not_in(stopped))
                ids = list((await conn.execute(query.with_for_update(skip_locked=True))).scalars())
                if not ids:
                    return []
                await conn.execute(update(steps).where(steps.c.id.in_(ids)).values(**values))
                rows = (await conn.execute(select(steps).where(steps.c.id.in_(ids)))).all()
            claimed = sorted((Claimed(from_row(StepRow, r)) for r in rows), key=lambda c: c.step.id)
            if claimed:
                await self._reserve(conn, claimed, now)
            return claimed

        result: list[Claimed] = await self._write("claim_steps", work)
        return result

    async def _reserve(self, conn: AsyncConnection, claimed: list[Claimed], now: datetime) -> None:
        wanted: dict[tuple[str, str, str], list[Claimed]] = {}
        inserts = []
        for c in claimed:
            s = c.step
            if s.reversible == Reversible.LEDGER.value:
                target = (s.owner, STEP_KIND, s.idempotency_key)
                payload: Any = {"action": s.action, "phase": s.phase, "seq": s.seq}
            elif s.reversible == Reversible.OVERRIDE.value and s.lease_ref:
                target = ("core", OVERRIDE_KIND, s.lease_ref)
                payload = None
            else:
                continue
            wanted.setdefault(target, []).append(c)
            inserts.append(
                {
                    "run_id": s.run_id,
                    "step_id": s.id,
                    "owner": target[0],
                    "kind": target[1],
                    "ref": target[2],
                    "payload": payload,
                    "state": ResourceState.PENDING.value,
                    "created_at": now,
                    "updated_at": now,
                    "attempts": 0,
                }
            )
        if not inserts:
            return
        # Two steps of one batch may borrow the same target: one row is inserted, and each
        # claimant is then judged against whoever holds it.
        seen: set[tuple[str, str, str]] = set()
        unique_inserts = []
        for row in inserts:
            key = (row["owner"], row["kind"], row["ref"])
            if key not in seen:
                seen.add(key)
                unique_inserts.append(row)
        await conn.execute(dialects.insert_ignore(self.dialect, run_resources), unique_inserts)
        # A placeholder's ref is its step's own key, so only that step's earlier attempt can
        # hold it: nothing to look up. A lease's target may be held by anyone.
        holders = await self._live_holders(conn, [t for t in wanted if t[1] == OVERRIDE_KIND])
        refused: dict[int, str] = {}
        dirty: set[int] = {c.step.run_id for t, cs in wanted.items() if t[1] == STEP_KIND for c in cs}
        for target, c in ((t, c) for t, cs in wanted.items() if t[1] == OVERRIDE_KIND for c in cs):
            holder = holders.get(target)
            if holder is None:  # pragma: no cover - the insert above guarantees a live row
                continue
            if holder.run_id != c.step.run_id:
                c.refused = f"{target[2]} is already held by run {holder.run_id}"
                refused[c.step.id] = c.refused
            else:
                # This step's own earlier attempt, or an earlier borrow of the same target
                # by the same run: either way, the row that is there is the one to use.
                c.reserved_id = holder.id
                dirty.add(c.step.run_id)
        await self._mark_dirty(conn, dirty)
        if refused:
            fatal: dict[int, str] = {}
            for c in claimed:
                if c.step.id in refused:
                    await conn.execute(
                        update(steps)
                        .where(steps.c.id == c.step.id)
                        .values(
                            status=StepStatus.FAILED.value,
                            ended_at=now,
                            claimed_by=None,
                            claim_expires=None,
                            error=refused[c.step.id],
                            attempt_log=[
                                *(c.step.attempt_log or []),
                                {
                                    "attempt": c.step.attempts,
                                    "at": now.isoformat(),
                                    "ended": now.isoformat(),
                                    "result": "failed",
                                    "error": refused[c.step.id],
                                },
                            ],
                        )
                    )
                    if c.step.on_error == "fail":
                        fatal.setdefault(c.step.run_id, f"step {c.step.name}: {refused[c.step.id]}")
            if fatal:
                await self._fail_runs(conn, fatal, now)

    async def _live_holders(
        self, conn: AsyncConnection, targets: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], ResourceRow]:
        found: dict[tuple[str, str, str], ResourceRow] = {}
        for chunk in _chunks(targets, 100):
            query = select(run_resources).where(
                tuple_(run_resources.c.owner, run_resources.c.kind, run_resources.c.ref).in_(list(chunk)),
                run_resources.c.state.in_(LIVE_STATES),
            )
            for r in await conn.execute(query):
                found[(r.owner, r.kind, r.ref)] = from_row(ResourceRow, r)
        return found

    async def _mark_dirty(self, conn: AsyncConnection, run_ids: Iterable[int]) -> None:
        """There is now something to clean up. Guarded: never walks a run back from
        `complete` or `incomplete`; only a human's "clean up again" does that."""
        ids = sorted(set(run_ids))
        if ids:
            await conn.execute(
                update(runs)
                .where(runs.c.id.in_(ids), runs.c.cleanup_status == CleanupStatus.NOT_REQUIRED.value)
                .values(cleanup_status=CleanupStatus.PENDING.value)
            )

    async def save_lease_value(self, resource_id: int, saved: Any, now: datetime) -> Any:
        """Keep the value a lease is about to overwrite, before it is overwritten, and answer
        the value the row keeps.

        The first value saved wins: two borrows of one target by one run share the row, and
        the later one may have read the earlier one's borrowed value, which is not the
        value to give back.
        """

        async def work(conn: AsyncConnection) -> Any:
            row = (
                await conn.execute(
                    select(run_resources.c.payload).where(run_resources.c.id == resource_id).with_for_update()
                )
            ).first()
            if row is not None and isinstance(row.payload, dict) and "saved" in row.payload:
                return row.payload["saved"]
            await conn.execute(
                update(run_resources)
                .where(run_resources.c.id == resource_id)
                .values(payload={"saved": saved}, updated_at=now)
            )
            return saved

        return await self._write("save_lease_value", work)

    async def get_resource(self, resource_id: int) -> ResourceRow:
        async def work(conn: AsyncConnection) -> ResourceRow:
            row = (await conn.execute(select(run_resources).where(run_resources.c.id == resource_id))).first()
            if row is None:
                raise NotFound(f"no resource {resource_id}")
            return from_row(ResourceRow, row)

        result: ResourceRow = await self._read(work)
        return result

    async def record_outcomes(self, outcomes: list[Outcome]) -> None:
        """Record a batch of answers in one transaction.

        Resources go in through the live-target key: a target this run already holds is
        "already recorded"; one another run holds becomes a rejection naming that run.
        Then placeholders resolve, leases confirm, steps end or wait for their retry.
        """
        if not outcomes:
            return

        async def work(conn: AsyncConnection) -> None:
            await self._record_resources(conn, outcomes)
            resolved = [o.step.idempotency_key for o in outcomes if o.resolve_placeholder]
            for chunk in _chunks(resolved):
                await conn.execute(
                    update(run_resources)
                    .where(
                        run_resources.c.kind == STEP_KIND,
                        run_resources.c.ref.in_(list(chunk)),
                        run_resources.c.state == ResourceState.PENDING.value,
                    )
                    .values(state=ResourceState.RESOLVED.value, updated_at=outcomes[0].at)
                )
            for o in outcomes:
                if o.confirm_lease and o.step.lease_ref:
                    await conn.execute(
                        update(run_resources)
                        .where(
                            run_resources.c.owner == "core",
                            run_resources.c.kind == OVERRIDE_KIND,
                            run_resources.c.ref == o.step.lease_ref,
                            run_resources.c.run_id == o.step.run_id,
                            run_resources.c.state.in_(LIVE_STATES),
                        )
                        .values(state=ResourceState.LIVE.value, until=o.lease_until, updated_at=o.at)
                    )
            await self._end_steps(conn, outcomes)
            fatal = {
                o.step.run_id: f"step {o.step.name}: {o.error}"
                for o in outcomes
                if o.status is StepStatus.FAILED and o.step.on_error == "fail"
            }
            if fatal:
                await self._fail_runs(conn, fatal, outcomes[0].at)

        await self._write("record_outcomes", work)

    async def _record_resources(self, conn: AsyncConnection, outcomes: list[Outcome]) -> None:
        rows = []
        for o in outcomes:
            for r in o.resources:
                rows.append(
                    {
                        "run_id": o.step.run_id,
                        "step_id": o.step.id,
                        "owner": o.step.owner,
                        "kind": r.kind,
                        "ref": r.ref,
                        "payload": r.payload,
                        "until": r.until,
                        "member_key": r.member_key,
                        "state": ResourceState.LIVE.value,
                        "created_at": o.at,
                        "updated_at": o.at,
                        "attempts": 0,
                    }
                )
        if not rows:
            return
        targets = [(r["owner"], r["kind"], r["ref"]) for r in rows]
        statement = dialects.insert_ignore(self.dialect, run_resources)
        if dialects.returning_update(self.dialect):
            # The rows that went in are this batch's; only the targets refused by the key
            # need a look at who holds them.
            cols = run_resources.c
            returned = await conn.execute(statement.returning(cols.owner, cols.kind, cols.ref, cols.run_id), rows)
            inserted = {(r.owner, r.kind, r.ref): int(r.run_id) for r in returned}
        else:
            await conn.execute(statement, rows)
            inserted = {}
        holders = await self._live_holders(conn, [t for t in targets if t not in inserted])
        dirty = set()
        for o in outcomes:
            for r in o.resources:
                target = (o.step.owner, r.kind, r.ref)
                holder_run = inserted.get(target)
                if holder_run is None and target in holders:
                    holder_run = holders[target].run_id
                if holder_run is not None and holder_run != o.step.run_id:
                    o.rejections.append(f"{r.kind} {r.ref!r} is already held by run {holder_run}")
                elif holder_run is not None:
                    o.recorded += 1
                    dirty.add(o.step.run_id)
        await self._mark_dirty(conn, dirty)

    async def _end_steps(self, conn: AsyncConnection, outcomes: list[Outcome]) -> None:
        params = []
        for o in outcomes:
            entry: dict[str, Any] = {
                "attempt": o.step.attempts,
                "at": (o.started or o.at).isoformat(),
                "ended": o.at.isoformat(),
                "result": "succeeded"
                if o.status is StepStatus.SUCCEEDED
                else "retry"
                if o.status is StepStatus.READY
                else "failed",
            }
            if o.error:
                entry["error"] = o.error
            params.append(
                {
                    "b_id": o.step.id,
                    "b_claimed_by": o.step.claimed_by,
                    "b_attempt": o.step.attempts,
                    "b_status": o.status.value,
                    "b_output": o.output,
                    "b_error": o.error,
                    "b_rejections": o.rejections or None,
                    "b_not_before": o.not_before or o.step.not_before,
                    "b_ended_at": o.at if o.status is not StepStatus.READY else None,
                    "b_log": [*(o.step.attempt_log or []), entry],
                }
            )
        statement = (
            update(steps)
            .where(
                steps.c.id == bindparam("b_id"),
                steps.c.status == StepStatus.RUNNING.value,
                # Only the claim that dispatched this attempt may end it: a worker whose
                # claim expired and was taken over answers too late to count.
                steps.c.claimed_by == bindparam("b_claimed_by"),
                steps.c.attempts == bindparam("b_attempt"),
            )
            .values(
                status=bindparam("b_status"),
                output=bindparam("b_output"),
                error=bindparam("b_error"),
                rejections=bindparam("b_rejections"),
                not_before=bindparam("b_not_before"),
                ended_at=bindparam("b_ended_at"),
                attempt_log=bindparam("b_log"),
                claimed_by=None,
                claim_expires=None,
            )
        )
        await conn.execute(statement, params)

    async def requeue_expired_claims(self, now: datetime) -> int:
        """Steps whose worker vanished go back to `ready` under the same key.

        The attempt that was lost counts; a step with no attempts left fails, because a
        worker that keeps dying on it is a failure too, and cleanup must get its turn.
        A claim is expired *at* its expiry, the moment `next_claim_expiry` names: a worker
        woken then must find the step, or a fake clock would stand still there for ever.
        """

        async def work(conn: AsyncConnection) -> int:
            query = select(
                steps.c.id, steps.c.run_id, steps.c.on_error, steps.c.name, steps.c.attempts, steps.c.max_attempts
            ).where(steps.c.status == StepStatus.RUNNING.value, steps.c.claim_expires <= now)
            if self.dialect != "sqlite":
                query = query.with_for_update(skip_locked=True)
            expired = (await conn.execute(query)).all()
            if not expired:
                return 0
            exhausted = [r for r in expired if r.attempts >= r.max_attempts]
            retry = [r.id for r in expired if r.attempts < r.max_attempts]
            lost = "the worker running its last attempt was lost"
            if exhausted:
                await conn.execute(
                    update(steps)
                    .where(steps.c.id.in_([r.id for r in exhausted]))
                    .values(
                        status=StepStatus.FAILED.value, ended_at=now, claimed_by=None, claim_expires=None, error=lost
                    )
                )
            for chunk in _chunks(retry):
                await conn.execute(
                    update(steps)
                    .where(steps.c.id.in_(list(chunk)))
                    .values(
                        status=StepStatus.READY.value,
                        claimed_by=None,
                        claim_expires=None,
                        not_before=now,
                        error="the worker running this step was lost; retried under the same key",
                    )
                )
            fatal = {r.run_id: f"step {r.name}: {lost}" for r in exhausted if r.on_error == "fail"}
            if fatal:
                await self._fail_runs(conn, fatal, now)
            return len(expired)

        result: int = await self._write("requeue_expired_claims", work)
        return result

    async def next_step_due(self) -> datetime | None:
        query = select(func.min(steps.c.not_before)).where(steps.c.status == StepStatus.READY.value)

        async def work(conn: AsyncConnection) -> datetime | None:
            value = (await conn.execute(query)).scalar()
            return _aware(value)

        result: datetime | None = await self._read(work)
        return result

    async def next_claim_expiry(self) -> datetime | None:
        query = select(func.min(steps.c.claim_expires)).where(steps.c.status == StepStatus.RUNNING.value)

        async def work(conn: AsyncConnection) -> datetime | None:
            return _aware((await conn.execute(query)).scalar())

        result: datetime | None = await self._read(work)
        return result

    async def list_steps(self, run_id: int) -> list[StepRow]:
        query = select(steps).where(steps.c.run_id == run_id).order_by(steps.c.phase, steps.c.seq)

        async def work(conn: AsyncConnection) -> list[StepRow]:
            return [from_row(StepRow, r) for r in await conn.execute(query)]

        result: list[StepRow] = await self._read(work)
        return result

    async def steps_by_ids(self, step_ids: list[int]) -> list[StepRow]:
        async def work(conn: AsyncConnection) -> list[StepRow]:
            found: list[StepRow] = []
            for chunk in _chunks(step_ids):
                found.extend(
                    from_row(StepRow, r) for r in await conn.execute(select(steps).where(steps.c.id.in_(list(chunk))))
                )
            return found

        result: list[StepRow] = await self._read(work)
        return result

    async def record_late_resources(self, step: StepRow, resources: list[NewResource], now: datetime) -> Outcome:
        """Resources a step's effect made by itself, reported after the step answered."""
        outcome = Outcome(step=step, status=StepStatus(step.status), at=now, resources=resources)

        async def work(conn: AsyncConnection) -> None:
            await self._record_resources(conn, [outcome])

        await self._write("record_late_resources", work)
        return outcome

    # -- the ledger, read half --------------------------------------------------------

    async def list_resources(
        self, run_id: int, *, live_only: bool = False, state: ResourceState | None = None
    ) -> list[ResourceRow]:
        query = select(run_resources).where(run_resources.c.run_id == run_id).order_by(run_resources.c.id)
        if live_only:
            query = query.where(run_resources.c.state.in_(LIVE_STATES))
        if state is not None:
            query = query.where(run_resources.c.state == state.value)

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return [from_row(ResourceRow, r) for r in await conn.execute(query)]

        result: list[ResourceRow] = await self._read(work)
        return result

    async def reverted_rows(self, run_id: int, *, after: int = 0, limit: int = 5000) -> list[ResourceRow]:
        """A page of a run's reverted module resources (not placeholders, not leases), by id."""
        query = (
            select(run_resources)
            .where(
                run_resources.c.run_id == run_id,
                run_resources.c.state == ResourceState.REVERTED.value,
                run_resources.c.kind.not_in([STEP_KIND, OVERRIDE_KIND]),
                run_resources.c.id > after,
            )
            .order_by(run_resources.c.id)
            .limit(limit)
        )

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return [from_row(ResourceRow, r) for r in await conn.execute(query)]

        result: list[ResourceRow] = await self._read(work)
        return result

    async def record_verification(self, run_id: int, verification: dict[str, Any], actor: str, now: datetime) -> None:
        """Add what a verification found and redid to the run's cleanup report, and audit it."""

        async def work(conn: AsyncConnection) -> None:
            row = (await conn.execute(select(runs.c.cleanup_report).where(runs.c.id == run_id))).first()
            report = dict(row.cleanup_report or {}) if row is not None else {}
            report["verify"] = verification
            await conn.execute(update(runs).where(runs.c.id == run_id).values(cleanup_report=report))
            summary = {k: verification[k] for k in ("verified", "came_back", "redone", "failed") if k in verification}
            await self._audit(conn, now, actor, "verify", f"run:{run_id}", summary)

        await self._write("record_verification", work)

    async def count_live_resources(self, run_id: int, *, member_key: str | None = None) -> int:
        query = select(func.count()).where(run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES))
        if member_key is not None:
            query = query.where(run_resources.c.member_key == member_key)

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar() or 0)

        result: int = await self._read(work)
        return result

    async def live_step_groups(
        self, run_id: int, *, member_key: str | None, before: int | None, limit: int
    ) -> list[tuple[int | None, int, int]]:
        """(step id, newest row id, live rows) of the steps with live rows, newest first."""
        newest = func.max(run_resources.c.id).label("newest")
        query = (
            select(run_resources.c.step_id, newest, func.count().label("rows"))
            .where(run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES))
            .group_by(run_resources.c.step_id)
            .order_by(newest.desc())
            .limit(limit)
        )
        if member_key is not None:
            query = query.where(run_resources.c.member_key == member_key)
        if before is not None:
            query = query.having(func.max(run_resources.c.id) < before)

        async def work(conn: AsyncConnection) -> list[tuple[int | None, int, int]]:
            return [(r.step_id, int(r.newest), int(r.rows)) for r in await conn.execute(query)]

        result: list[tuple[int | None, int, int]] = await self._read(work)
        return result

    async def live_rows_of_steps(
        self, run_id: int, step_ids: list[int | None], *, member_key: str | None
    ) -> list[ResourceRow]:
        ids = [s for s in step_ids if s is not None]
        condition: ColumnElement[bool] = run_resources.c.step_id.in_(ids)
        if None in step_ids:
            condition = or_(condition, run_resources.c.step_id.is_(None))
        query = (
            select(run_resources)
            .where(run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES), condition)
            .order_by(run_resources.c.id.desc())
        )
        if member_key is not None:
            query = query.where(run_resources.c.member_key == member_key)

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return [from_row(ResourceRow, r) for r in await conn.execute(query)]

        result: list[ResourceRow] = await self._read(work)
        return result

    async def mark_reverted(self, ids: list[int], now: datetime) -> None:
        """Reverted rows stay for history; leaving the live states frees their targets."""
        if not ids:
            return

        async def work(conn: AsyncConnection) -> None:
            for chunk in _chunks(ids):
                await conn.execute(
                    update(run_resources)
                    .where(run_resources.c.id.in_(list(chunk)), run_resources.c.state.in_(LIVE_STATES))
                    .values(
                        state=ResourceState.REVERTED.value,
                        reverted_at=now,
                        updated_at=now,
                        error=None,
                        attempts=run_resources.c.attempts + 1,
                    )
                )

        await self._write("mark_reverted", work)

    async def mark_revert_failed(self, failures: dict[int, str], now: datetime) -> None:
        if not failures:
            return

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(run_resources)
                .where(run_resources.c.id == bindparam("b_id"))
                .values(error=bindparam("b_error"), attempts=run_resources.c.attempts + 1, updated_at=now),
                [{"b_id": i, "b_error": e[:2000]} for i, e in failures.items()],
            )

        await self._write("mark_revert_failed", work)

    async def claim_cleanup(
        self, run_id: int, worker: str, now: datetime, ttl: float, *, again: bool, scoped: bool = False
    ) -> bool:
        """Take a run's cleanup, so one worker does it. `again` is a human's retry: it may
        move `complete`/`incomplete` back to `pending` (the only path that does). A
        `scoped` cleanup (one member) leaves the status alone."""

        async def work(conn: AsyncConnection) -> bool:
            values: dict[str, Any] = {
                "cleanup_claimed_by": worker,
                "cleanup_claim_expires": now + timedelta(seconds=ttl),
                "cleanup_attempts": runs.c.cleanup_attempts + 1,
                "cleanup_started_at": now,
            }
            condition = [
                runs.c.id == run_id,
                or_(
                    runs.c.cleanup_claimed_by.is_(None),
                    runs.c.cleanup_claim_expires < now,
                    runs.c.cleanup_claimed_by == worker,
                ),
            ]
            if scoped:
                pass
            elif again:
                values["cleanup_status"] = CleanupStatus.PENDING.value
            else:
                condition.append(runs.c.cleanup_status == CleanupStatus.PENDING.value)
            changed = await conn.execute(update(runs).where(*condition).values(**values))
            return bool(changed.rowcount)

        result: bool = await self._write("claim_cleanup", work)
        return result

    async def extend_cleanup_claim(self, run_id: int, worker: str, now: datetime, ttl: float) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.cleanup_claimed_by == worker)
                .values(cleanup_claim_expires=now + timedelta(seconds=ttl))
            )

        await self._write("extend_cleanup_claim", work)

    async def finish_cleanup(
        self,
        run_id: int,
        worker: str,
        status: CleanupStatus | None,
        report: dict[str, Any],
        actor: str,
        now: datetime,
    ) -> None:
        """Record a cleanup's report and release its claim; `status` None leaves it as it was."""

        async def work(conn: AsyncConnection) -> None:
            values: dict[str, Any] = {
                "cleanup_report": report,
                "cleanup_ended_at": now,
                "cleanup_claimed_by": None,
                "cleanup_claim_expires": None,
            }
            if status is not None:
                values["cleanup_status"] = status.value
            await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
            summary = {k: report[k] for k in ("status", "member_key", "reverted", "restored", "failed") if k in report}
            await self._audit(conn, now, actor, "cleanup", f"run:{run_id}", summary)

        await self._write("finish_cleanup", work)

    async def runs_due_cleanup(self, now: datetime) -> list[int]:
        """Ended runs with `auto` cleanup that are dirty and not being cleaned by anyone."""
        query = (
            select(runs.c.id)
            .where(
                runs.c.status.in_([s.value for s in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)]),
                runs.c.cleanup_policy == "auto",
                runs.c.cleanup_status == CleanupStatus.PENDING.value,
                or_(runs.c.cleanup_claimed_by.is_(None), runs.c.cleanup_claim_expires < now),
            )
            .order_by(runs.c.id)
        )

        async def work(conn: AsyncConnection) -> list[int]:
            return [int(r.id) for r in await conn.execute(query)]

        result: list[int] = await self._read(work)
        return result

    async def expired_leases(self, now: datetime, limit: int = 100) -> list[ResourceRow]:
        query = (
            select(run_resources)
            .where(
                run_resources.c.kind == OVERRIDE_KIND,
                run_resources.c.state == ResourceState.LIVE.value,
                run_resources.c.until.is_not(None),
                run_resources.c.until <= now,
                run_resources.c.attempts < 5,  # after that, cleanup and a human take over
            )
            .order_by(run_resources.c.until)
            .limit(limit)
        )

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return [from_row(ResourceRow, r) for r in await conn.execute(query)]

        result: list[ResourceRow] = await self._read(work)
        return result

    async def claim_expired_lease(self, resource_id: int, now: datetime, ttl: float) -> bool:
        """Take the restore of one expired lease, so that one worker restores it.

        A guarded update: the row must still be live and untouched since it expired (or
        since a claim `ttl` ago, whose worker died), and its run's cleanup must not be in
        hands, since that cleanup restores it too. Taking it moves `updated_at` to now,
        which is what a second sweeper holding the same read then fails to match. Without
        this, a slow sweeper could give back a value after the target was freed and
        borrowed again by another run, overwriting that run's value.
        """
        stale = now - timedelta(seconds=ttl)
        cleaning = (
            select(runs.c.id)
            .where(
                runs.c.id == run_resources.c.run_id,
                runs.c.cleanup_claimed_by.is_not(None),
                runs.c.cleanup_claim_expires >= now,
            )
            .exists()
        )

        async def work(conn: AsyncConnection) -> bool:
            changed = await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.state == ResourceState.LIVE.value,
                    run_resources.c.until <= now,
                    or_(run_resources.c.updated_at <= run_resources.c.until, run_resources.c.updated_at < stale),
                    ~cleaning,
                )
                .values(updated_at=now)
            )
            return bool(changed.rowcount)

        result: bool = await self._write("claim_expired_lease", work)
        return result

    async def next_lease_expiry(self) -> datetime | None:
        query = select(func.min(run_resources.c.until)).where(
            run_resources.c.kind == OVERRIDE_KIND, run_resources.c.state == ResourceState.LIVE.value
        )

        async def work(conn: AsyncConnection) -> datetime | None:
            return _aware((await conn.execute(query)).scalar())

        result: datetime | None = await self._read(work)
        return result

    async def leases_in_force(self) -> list[ResourceRow]:
        query = (
            select(run_resources)
            .where(run_resources.c.kind == OVERRIDE_KIND, run_resources.c.state.in_(LIVE_STATES))
            .order_by(run_resources.c.ref)
        )

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return [from_row(ResourceRow, r) for r in await conn.execute(query)]

        result: list[ResourceRow] = await self._read(work)
        return result

    async def abandon_resource(self, resource_id: int, actor: str, reason: str, now: datetime) -> ResourceRow:
        """An admin's `forget`: the row is kept as `abandoned`, its target freed, and audited."""

        async def work(conn: AsyncConnection) -> ResourceRow:
            row = (await conn.execute(select(run_resources).where(run_resources.c.id == resource_id))).first()
            if row is None:
                raise NotFound(f"no resource {resource_id}")
            if row.state not in LIVE_STATES:
                raise InvalidState(f"resource {resource_id} is {row.state}, not live")
            await conn.execute(
                update(run_resources)
                .where(run_resources.c.id == resource_id)
                .values(state=ResourceState.ABANDONED.value, updated_at=now, error=f"forgotten by {actor}: {reason}")
            )
            await self._audit(
                conn,
                now,
                actor,
                "resource.forget",
                f"run:{row.run_id}",
                {"resource": resource_id, "kind": row.kind, "ref": row.ref, "reason": reason},
            )
            return from_row(ResourceRow, row)

        result: ResourceRow = await self._write("abandon_resource", work)
        return result

    # -- workers --------------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, *, host: str, pid: int, concurrency: int, version: str, now: datetime
    ) -> None:
        """A worker says it has started. The same id registering again starts afresh."""
        values: dict[str, Any] = {
            "host": host[:200],
            "pid": pid,
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
            "concurrency": concurrency,
            "version": version[:32],
        }

        async def work(conn: AsyncConnection) -> None:
            known = (await conn.execute(select(workers.c.worker_id).where(workers.c.worker_id == worker_id))).first()
            if known is None:
                await conn.execute(workers.insert().values(worker_id=worker_id, **values))
            else:
                await conn.execute(update(workers).where(workers.c.worker_id == worker_id).values(**values))

        await self._write("register_worker", work)

    async def heartbeat_worker(
        self,
        worker_id: str,
        now: datetime,
        ttl: float,
        *,
        step_ids: Sequence[int] = (),
        cleanup_run_ids: Sequence[int] = (),
    ) -> set[int]:
        """The worker's heartbeat: one transaction per interval, whatever it holds.

        The worker is alive, and the steps it has in flight and the cleanups it is doing
        are still its own: their claims now expire `ttl` from now. Only what the worker
        names is extended, so a claim it made and then lost track of (the commit went
        through, the answer did not) still expires and is taken over.

        Answers which of `step_ids` it no longer holds: another worker took them over
        after their claims expired, and their dispatches are to be abandoned, not recorded.
        """
        until = now + timedelta(seconds=ttl)
        ids = sorted(set(step_ids))

        async def work(conn: AsyncConnection) -> set[int]:
            await conn.execute(
                update(workers)
                .where(workers.c.worker_id == worker_id, workers.c.stopped_at.is_(None))
                .values(heartbeat_at=now)
            )
            held: set[int] = set()
            for chunk in _chunks(ids):
                await conn.execute(
                    update(steps)
                    .where(
                        steps.c.id.in_(list(chunk)),
                        steps.c.claimed_by == worker_id,
                        steps.c.status == StepStatus.RUNNING.value,
                    )
                    .values(claim_expires=until)
                )
                held.update(
                    int(r.id)
                    for r in await conn.execute(
                        select(steps.c.id).where(
                            steps.c.id.in_(list(chunk)),
                            steps.c.claimed_by == worker_id,
                            steps.c.status == StepStatus.RUNNING.value,
                        )
                    )
                )
            if cleanup_run_ids:
                await conn.execute(
                    update(runs)
                    .where(runs.c.id.in_(sorted(set(cleanup_run_ids))), runs.c.cleanup_claimed_by == worker_id)
                    .values(cleanup_claim_expires=until)
                )
            return set(ids) - held

        result: set[int] = await self._write("heartbeat_worker", work)
        return result

    async def deregister_worker(self, worker_id: str, now: datetime) -> tuple[int, int]:
        """A worker stops cleanly: it is marked stopped, and gives back what it still holds.

        By then its in-flight dispatches have answered (a graceful stop waits for them),
        so a step still claimed in its name was never dispatched: it goes back to `ready`
        without its attempt counting. Its cleanup claims are released for another worker.
        Answers (steps released, cleanups released).
        """

        async def work(conn: AsyncConnection) -> tuple[int, int]:
            await conn.execute(
                update(workers).where(workers.c.worker_id == worker_id).values(stopped_at=now, heartbeat_at=now)
            )
            released = await conn.execute(
                update(steps)
                .where(steps.c.claimed_by == worker_id, steps.c.status == StepStatus.RUNNING.value)
                .values(
                    status=StepStatus.READY.value,
                    claimed_by=None,
                    claim_expires=None,
                    not_before=now,
                    attempts=case((steps.c.attempts > 0, steps.c.attempts - 1), else_=0),
                )
            )
            cleanups = await conn.execute(
                update(runs)
                .where(runs.c.cleanup_claimed_by == worker_id)
                .values(cleanup_claimed_by=None, cleanup_claim_expires=None)
            )
            return int(released.rowcount or 0), int(cleanups.rowcount or 0)

        result: tuple[int, int] = await self._write("deregister_worker", work)
        return result

    async def list_workers(self, now: datetime, ttl: float, *, limit: int = 200) -> list[WorkerRow]:
        """Workers, newest first, each alive, stopped or dead (no heartbeat for `ttl`), with
        how many running steps and cleanups are claimed in its name."""
        running = (
            select(steps.c.claimed_by.label("worker"), func.count().label("n"))
            .where(steps.c.status == StepStatus.RUNNING.value, steps.c.claimed_by.is_not(None))
            .group_by(steps.c.claimed_by)
            .subquery()
        )
        cleaning = (
            select(runs.c.cleanup_claimed_by.label("worker"), func.count().label("n"))
            .where(runs.c.cleanup_claimed_by.is_not(None))
            .group_by(runs.c.cleanup_claimed_by)
            .subquery()
        )
        query = (
            select(
                workers,
                func.coalesce(running.c.n, 0).label("steps"),
                func.coalesce(cleaning.c.n, 0).label("cleanups"),
            )
            .select_from(
                workers.outerjoin(running, running.c.worker == workers.c.worker_id).outerjoin(
                    cleaning, cleaning.c.worker == workers.c.worker_id
                )
            )
            .order_by(workers.c.started_at.desc(), workers.c.worker_id)
            .limit(limit)
        )
        fresh = now - timedelta(seconds=ttl)

        async def work(conn: AsyncConnection) -> list[WorkerRow]:
            found = []
            for r in await conn.execute(query):
                heartbeat = _aware(r.heartbeat_at)
                assert heartbeat is not None
                if r.stopped_at is not None:
                    state = WorkerState.STOPPED
                elif heartbeat >= fresh:
                    state = WorkerState.ALIVE
                else:
                    state = WorkerState.DEAD
                found.append(
                    WorkerRow(
                        worker_id=r.worker_id,
                        host=r.host,
                        pid=int(r.pid),
                        started_at=r.started_at,
                        heartbeat_at=heartbeat,
                        stopped_at=r.stopped_at,
                        concurrency=int(r.concurrency),
                        version=r.version,
                        state=state.value,
                        steps=int(r.steps),
                        cleanups=int(r.cleanups),
                    )
                )
            return found

        result: list[WorkerRow] = await self._read(work)
        return result

    # -- audit ----------------------------------------------------------------------

    async def _audit(
        self, conn: AsyncConnection, now: datetime, actor: str, action: str, subject: str, detail: Any
    ) -> None:
        await conn.execute(audit.insert().values(at=now, actor=actor, action=action, subject=subject, detail=detail))

    async def list_audit(self, subject: str | None = None, limit: int = 100) -> list[AuditRow]:
        query = select(audit).order_by(audit.c.id.desc()).limit(limit)
        if subject:
            query = query.where(audit.c.subject == subject)

        async def work(conn: AsyncConnection) -> list[AuditRow]:
            return [from_row(AuditRow, r) for r in await conn.execute(query)]

        result: list[AuditRow] = await self._read(work)
        return result

    # -- the web: reads for the API and dashboard, tokens, sessions -------------------

    async def ping(self) -> None:
        """One round trip to the database, for health checks."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(select(1))

        await self._read(work)

    async def list_event_versions(self, event_id: str) -> list[EventRow]:
        """Every stored version of one event, newest first."""
        query = select(events).where(events.c.event_id == event_id).order_by(events.c.version.desc())

        async def work(conn: AsyncConnection) -> list[EventRow]:
            found = [from_row(EventRow, r) for r in await conn.execute(query)]
            if not found:
                raise NotFound(f"no event {event_id!r}")
            return found

        result: list[EventRow] = await self._read(work)
        return result

    async def count_runs(self, *, status: str | None = None, event_id: str | None = None) -> int:
        """How many runs `list_runs` would page through with the same filters."""
        query = select(func.count()).select_from(runs)
        if status:
            query = query.where(runs.c.status == status)
        if event_id:
            query = query.where(runs.c.event_id == event_id)

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar() or 0)

        result: int = await self._read(work)
        return result

    async def count_runs_by_status(self) -> dict[str, int]:
        """Runs per state, for the metrics gauge."""
        query = select(runs.c.status, func.count()).group_by(runs.c.status)

        async def work(conn: AsyncConnection) -> dict[str, int]:
            return {str(status): int(n) for status, n in await conn.execute(query)}

        result: dict[str, int] = await self._read(work)
        return result

    async def count_all_live_resources(self) -> int:
        """Ledger rows that still hold their target, across every run."""
        query = select(func.count()).where(run_resources.c.state.in_(LIVE_STATES))

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar() or 0)

        result: int = await self._read(work)
        return result

    async def create_token(
        self, *, key: str, name: str, role: str, secret_hash: str, actor: str, now: datetime
    ) -> TokenRow:
        """Store a new API token (its secret's hash only). Names are unique among all tokens."""

        async def work(conn: AsyncConnection) -> TokenRow:
            taken = (await conn.execute(select(api_tokens.c.id).where(api_tokens.c.name == name))).first()
            if taken is not None:
                raise InvalidState(f"a token named {name!r} exists already")
            row = (
                await conn.execute(
                    api_tokens.insert()
                    .values(key=key, name=name, role=role, secret_hash=secret_hash, created_at=now, created_by=actor)
                    .returning(*api_tokens.c)
                )
            ).one()
            await self._audit(conn, now, actor, "token.create", f"token:{name}", {"role": role, "key": key})
            return from_row(TokenRow, row)

        result: TokenRow = await self._write("create_token", work)
        return result

    async def list_tokens(self) -> list[TokenRow]:
        query = select(api_tokens).order_by(api_tokens.c.id)

        async def work(conn: AsyncConnection) -> list[TokenRow]:
            return [from_row(TokenRow, r) for r in await conn.execute(query)]

        result: list[TokenRow] = await self._read(work)
        return result

    async def find_token(self, key: str) -> TokenRow | None:
        """The token whose public key is `key`, revoked or not; None when there is none."""

        async def work(conn: AsyncConnection) -> TokenRow | None:
            row = (await conn.execute(select(api_tokens).where(api_tokens.c.key == key))).first()
            return from_row(TokenRow, row) if row is not None else None

        result: TokenRow | None = await self._read(work)
        return result

    async def revoke_token(self, token: str, actor: str, now: datetime) -> TokenRow:
        """Revoke a token named by its name, key or id, and end its sessions. Audited."""
        condition = or_(api_tokens.c.name == token, api_tokens.c.key == token)
        if token.isdigit():
            condition = or_(condition, api_tokens.c.id == int(token))

        async def work(conn: AsyncConnection) -> TokenRow:
            row = (await conn.execute(select(api_tokens).where(condition).order_by(api_tokens.c.id))).first()
            if row is None:
                raise NotFound(f"no token {token!r}")
            if row.revoked_at is not None:
                raise InvalidState(f"token {row.name!r} is revoked already")
            await conn.execute(update(api_tokens).where(api_tokens.c.id == row.id).values(revoked_at=now))
            await conn.execute(delete(web_sessions).where(web_sessions.c.token_id == row.id))
            await self._audit(conn, now, actor, "token.revoke", f"token:{row.name}", {"key": row.key})
            revoked = (await conn.execute(select(api_tokens).where(api_tokens.c.id == row.id))).one()
            return from_row(TokenRow, revoked)

        result: TokenRow = await self._write("revoke_token", work)
        return result

    async def create_session(
        self, *, id_hash: str, token: TokenRow, csrf: str, now: datetime, expires_at: datetime
    ) -> None:
        """Open a dashboard session for `token` (and drop sessions that have expired). Audited."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(web_sessions).where(web_sessions.c.expires_at < now))
            await conn.execute(
                web_sessions.insert().values(
                    id_hash=id_hash, token_id=token.id, csrf=csrf, created_at=now, expires_at=expires_at
                )
            )
            await self._audit(conn, now, token.name, "session.open", f"token:{token.name}", None)

        await self._write("create_session", work)

    async def get_session(self, id_hash: str, now: datetime) -> SessionRow | None:
        """The unexpired session with this id hash whose token is not revoked, else None."""
        query = (
            select(web_sessions, *[c.label(f"t_{c.name}") for c in api_tokens.c])
            .join(api_tokens, api_tokens.c.id == web_sessions.c.token_id)
            .where(
                web_sessions.c.id_hash == id_hash,
                web_sessions.c.expires_at > now,
                api_tokens.c.revoked_at.is_(None),
            )
        )

        async def work(conn: AsyncConnection) -> SessionRow | None:
            row = (await conn.execute(query)).first()
            if row is None:
                return None
            m = row._mapping
            token = TokenRow(**{c.name: m[f"t_{c.name}"] for c in api_tokens.c})
            return SessionRow(m["id"], m["token_id"], m["csrf"], m["created_at"], m["expires_at"], token)

        result: SessionRow | None = await self._read(work)
        return result

    async def end_session(self, id_hash: str, actor: str, now: datetime) -> None:
        """Sign out: the session is deleted. Audited."""

        async def work(conn: AsyncConnection) -> None:
            changed = await conn.execute(delete(web_sessions).where(web_sessions.c.id_hash == id_hash))
            if changed.rowcount:
                await self._audit(conn, now, actor, "session.close", f"token:{actor}", None)

        await self._write("end_session", work)


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    return UTCDateTime().process_result_value(value, None)  # type: ignore[arg-type]

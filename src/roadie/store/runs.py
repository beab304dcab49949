"""Runs: creating them, reading them, moving them on, cancelling them."""

from __future__ import annotations

import secrets
from collections.abc import Container, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    CompoundSelect,
    Select,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.sql.sqltypes import NullType

from roadie.errors import NotFound, StoreError
from roadie.log import get_logger
from roadie.states import (
    CleanupStatus,
    RunStatus,
    StepStatus,
)
from roadie.store import statements
from roadie.store.audit import audit_entry, record_audit
from roadie.store.connector import Connector, chunks
from roadie.store.dialects import MYSQL_FAMILY
from roadie.store.executemany import execute_many
from roadie.store.json_text import json_dumps
from roadie.store.notify import notify_runs
from roadie.store.records import NewRun, PhaseCounts, RunMove
from roadie.store.rows import EventRow, ResourceRow, RunRow, StepRow, from_row, from_rows
from roadie.store.tables import (
    audit,
    run_resources,
    runs,
    steps,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

log = get_logger(__name__)

# Every view of a run (its page, the API's run) reads these: built once, with the run's id
# bound at execution. Against building them per request, the run page's app took 19 % less
# time in-process (4.8 → 3.9 ms, medians of 12 interleaved rounds of 100 requests).
_VIEW_RUN = select(runs).where(runs.c.id == bindparam("run_id"))
# A run's columns but its frozen definition, which grows with its steps (to megabytes):
# for reads that need only its state.
_RUN_STATE = [c for c in runs.c if c.name != "definition"]
_VIEW_RUN_BARE = select(*_RUN_STATE).where(runs.c.id == bindparam("run_id"))
# A step's parameters, retry policy and answer, which a run's page does not show and
# which may be large (a module's answer): left unread by run_view.
_STEP_DETAIL = ("params", "retry", "output")
_VIEW_STEPS = (
    select(*(c for c in steps.c if c.name not in _STEP_DETAIL))
    .where(steps.c.run_id == bindparam("run_id"))
    .order_by(steps.c.phase, steps.c.seq)
)
_VIEW_ROWS = select(run_resources).where(run_resources.c.run_id == bindparam("run_id")).order_by(run_resources.c.id)


def _undecoded(dialect_name: str) -> CompoundSelect[Any]:
    """The same three as one statement, each row tagged with the view it is from and each
    column as the driver gives it: no JSON, time or row decoded. SQLite's columns take any
    type; elsewhere each column is made text, so that the three can be one result. The
    run's definition is left out: it is frozen when the run is made."""
    views = (_VIEW_RUN_BARE, _VIEW_STEPS, _VIEW_ROWS)
    width = max(len(view.selected_columns) for view in views)

    def raw(column: Any) -> Any:
        return type_coerce(column, NullType()) if dialect_name == "sqlite" else cast(column, Text)

    return union_all(
        *(
            view.order_by(None).with_only_columns(
                literal_column(str(tag)),
                *(raw(c) for c in view.selected_columns),
                *(null() for _ in range(width - len(view.selected_columns))),
            )
            for tag, view in enumerate(views)
        )
    )


_UNDECODED = {name: _undecoded(name) for name in ("sqlite", "postgresql", "mysql", "mariadb")}


ANALYZE_AFTER = 5_000
"""Steps materialised at once from which PostgreSQL is asked to count the table again
(`RunQueries._analyze_steps`)."""


RUNS_AT_ONCE = 500
"""The most runs one INSERT carries."""

RUNS_BYTES = 4 * 1024 * 1024
"""The most runs' definitions and params, as JSON, that one INSERT carries on MariaDB: a
quarter of its default `max_allowed_packet` (16 MiB), past which the server drops the
connection mid-statement (500 runs of 100 steps, about 20 MiB, were lost that way and
retried for 13 s as a lost connection)."""


def _run_batches(dialect: str, rows: list[dict[str, Any]]) -> Iterable[Sequence[dict[str, Any]]]:
    """`rows` (runs to insert) a statement's worth at a time: `RUNS_AT_ONCE`, and on MariaDB no
    more than `RUNS_BYTES` of their JSON (a run alone may be more: it goes alone)."""
    if dialect not in MYSQL_FAMILY:
        yield from chunks(rows, RUNS_AT_ONCE)
        return
    batch: list[dict[str, Any]] = []
    size = 0
    for row in rows:
        weight = len(json_dumps(row["definition"])) + len(json_dumps(row["params"]))
        if batch and (size + weight > RUNS_BYTES or len(batch) == RUNS_AT_ONCE):
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += weight
    if batch:
        yield batch


class RunQueries(Connector):
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
        """Insert one run: `create_runs` of one."""
        new = NewRun(event, definition, params, cleanup_policy, first_phase_due, schedule_key)
        [row] = await self.create_runs([new], actor, now)
        return row

    async def create_runs(self, new: list[NewRun], actor: str, now: datetime) -> list[RunRow | None]:
        """Insert runs, with their audit entries, in one transaction: a run each, in order.

        A run with a `schedule_key` (one occurrence of a schedule) is kept at most once per
        key by the database: when the key is taken, another worker made that occurrence's
        run already, nothing is inserted for it, and its answer is None."""
        nonces = [secrets.token_hex(6) for _ in new]
        values: list[dict[str, Any]] = [
            {
                "nonce": nonce,
                "event_id": n.event.event_id,
                "event_version": n.event.version,
                "title": n.event.title,
                "definition": n.definition,
                "params": n.params,
                "status": RunStatus.PENDING.value,
                "cleanup_policy": n.cleanup_policy,
                "cleanup_status": CleanupStatus.NOT_REQUIRED.value,
                "phase": 0,
                "materialised_phase": -1,
                "phase_due_at": n.first_phase_due,
                "cancel_requested": n.refused is not None,
                "error": n.refused,
                "created_at": now,
                "created_by": actor,
                "cleanup_attempts": 0,
                "schedule_key": n.schedule_key,
            }
            for n, nonce in zip(new, nonces, strict=True)
        ]
        plain = [v for v in values if v["schedule_key"] is None]
        keyed = [v for v in values if v["schedule_key"] is not None]

        given = {v["nonce"]: v["definition"] for v in plain}

        async def work(conn: AsyncConnection) -> list[RunRow | None]:
            made: dict[str, RunRow] = {}  # by nonce
            for chunk in _run_batches(self.dialect, plain):
                # Many runs go in as one array a column, whose text does not grow with
                # them; one run's plain VALUES is shorter, and its definition (which may
                # run to megabytes) is dumped faster alone than as an array's element.
                # Each run's row is found by its nonce: the order rows come back in is no matter.
                if len(chunk) == 1:
                    statement, parameters = runs.insert(), chunk[0]
                else:
                    statement, parameters = statements.insert_rows(self.dialect, runs, list(chunk))
                # Not the definition, which is in hand: read back, it would be decoded again.
                inserted = await conn.execute(statement.returning(*_RUN_STATE), parameters)
                made.update((r.nonce, from_row(RunRow, r, definition=given[r.nonce])) for r in inserted)
            if keyed:
                # The key's unique constraint decides; the nonce says whether this insert
                # is the one that won. (No savepoint and no RETURNING on a conflict: both
                # behave differently on each database.)
                await conn.execute(statements.insert_ignore(self.dialect, runs), keyed)
                keys = [v["schedule_key"] for v in keyed]
                for r in await conn.execute(select(runs).where(runs.c.schedule_key.in_(keys))):
                    made[r.nonce] = from_row(RunRow, r)
            rows = [made.get(nonce) for nonce in nonces]
            entries = []
            for row, n in zip(rows, new, strict=True):
                if row is None:
                    continue
                detail: dict[str, Any] = {"event": n.event.event_id, "params": n.params}
                if n.schedule_key is not None:
                    detail["schedule_key"] = n.schedule_key
                entries.append(audit_entry(now, actor, "run.start", f"run:{row.id}", detail))
                if n.overridden:
                    forced = {"event": n.event.event_id, "overridden": n.overridden}
                    entries.append(audit_entry(now, actor, "run.force", f"run:{row.id}", forced))
                if n.refused is not None:
                    refused = {"event": n.event.event_id, "schedule_key": n.schedule_key, "error": n.refused}
                    entries.append(audit_entry(now, actor, "run.refused", f"run:{row.id}", refused))
            if entries:
                await execute_many(conn, *statements.insert_rows(self.dialect, audit, entries))
            return rows

        result: list[RunRow | None] = await self._write("create_run", work)
        return result

    async def get_run(self, run_id: int, *, definition: bool = True) -> RunRow:
        """A run. `definition=False` leaves its frozen definition unread (answered empty),
        for a caller that needs only its state: the definition grows with the run's steps
        (to megabytes), and decoding it would be most of what such a read costs."""

        async def work(conn: AsyncConnection) -> RunRow:
            row = (await conn.execute(_VIEW_RUN if definition else _VIEW_RUN_BARE, {"run_id": run_id})).first()
            if row is None:
                raise NotFound(f"no run {run_id}")
            return from_row(RunRow, row) if definition else from_row(RunRow, row, definition={})

        result: RunRow = await self._read(work, one_statement=True)
        return result

    async def run_view(self, run_id: int) -> tuple[RunRow, list[StepRow], list[ResourceRow]]:
        """A run with its steps (in order) and its ledger rows (oldest first), read in one
        transaction: one consistent view, for a page that shows all three. The steps come
        without their parameters, retry policy and answer (answered empty)."""

        async def work(conn: AsyncConnection) -> tuple[RunRow, list[StepRow], list[ResourceRow]]:
            given = {"run_id": run_id}
            row = (await conn.execute(_VIEW_RUN, given)).first()
            if row is None:
                raise NotFound(f"no run {run_id}")
            found = from_rows(StepRow, await conn.execute(_VIEW_STEPS, given), params={}, retry={}, output=None)
            return (
                from_row(RunRow, row),
                found,
                from_rows(ResourceRow, await conn.execute(_VIEW_ROWS, given)),
            )

        result: tuple[RunRow, list[StepRow], list[ResourceRow]] = await self._read(work)
        return result

    async def run_view_undecoded(self, run_id: int) -> frozenset[tuple[Any, ...]]:
        """What `run_view` reads, as the driver gives it, but the run's definition (frozen
        when the run is made), in one statement: two equal answers mean that `run_view`
        would answer the same, and comparing them costs a fraction of decoding (a page
        drawn from a run's rows can be given again while they stay the same). Each row
        holds its id and the columns it is ordered by, so the rows are compared as a set."""
        query = _UNDECODED[self.dialect]

        async def work(conn: AsyncConnection) -> frozenset[tuple[Any, ...]]:
            return frozenset((await conn.execute(query, {"run_id": run_id})).tuples())

        result: frozenset[tuple[Any, ...]] = await self._read(work, one_statement=True)
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
            return from_rows(RunRow, await conn.execute(query))

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
                await skip_ready_steps(conn, [run_id], now, "run cancelled")
                await record_audit(conn, now, actor, "run.cancel", f"run:{run_id}", None)
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
                *_RUN_STATE,
                func.coalesce(counts.c.ready, 0).label("ready"),
                func.coalesce(counts.c.running, 0).label("running"),
            )
            .select_from(runs.outerjoin(counts, counts.c.run_id == runs.c.id))
            .where(in_flight)
            .order_by(runs.c.id)
        )

        async def work(conn: AsyncConnection) -> list[PhaseCounts]:
            found = (await conn.execute(query)).all()
            # Made by `from_rows` and read by place, not by name: a Row's attribute is found
            # only after an AttributeError is raised and caught inside it.
            made = from_rows(RunRow, found, definition={})
            definitions: dict[int, Any] = {}
            for chunk in chunks([run.id for run in made if run.id not in known]):
                wanted = select(runs.c.id, runs.c.definition).where(statements.one_of(self.dialect, runs.c.id, chunk))
                definitions.update(tuple(r) for r in await conn.execute(wanted))
            return [
                # ready and running are the query's last two columns
                PhaseCounts(
                    replace(run, definition=definitions[run.id]) if run.id in definitions else run, *map(int, r[-2:])
                )
                for run, r in zip(made, found, strict=True)
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

        started = [m.run.id for m in moves if m.fail is None and m.steps and m.run.started_at is None]
        ended = [m.run.id for m in moves if m.fail is None and m.finish is not None]

        async def work(conn: AsyncConnection) -> None:
            for chunk in chunks(rows):
                await execute_many(conn, *statements.insert_rows(self.dialect, steps, list(chunk), ignore=True))
            if updates:
                fixed, executed = statements.many_rows_params(self.dialect, _ADVANCING, updates)
                await execute_many(conn, _advancing(self.dialect, fixed), executed)
            skip = [m.run.id for m in moves if m.skip_ready]
            if skip:
                await skip_ready_steps(conn, skip, now, "run stopped")
            failing = {m.run.id: m.fail for m in moves if m.fail}
            if failing:
                await fail_runs(conn, failing, now)
            await notify_runs(conn, self.dialect, started, ended, now)

        await self._write("materialise_phase" if rows else "advance_runs", work)
        if self.dialect == "postgresql" and len(rows) >= ANALYZE_AFTER:
            await self._analyze_steps()

    async def _analyze_steps(self) -> None:
        """Have PostgreSQL count the steps again, after many came at once: until it has,
        it plans the claim for the table it last counted, and for a queue of tens of
        thousands of ready steps where it counted a few it reads and sorts them all at
        every claim (75 ms each at 50,000) instead of reading the first hundred from the
        index (1.5 ms). Its own count (autovacuum) comes a minute or more later. A failure
        here costs only that time, so it is told, not raised."""
        try:
            await self._write("analyze_steps", lambda conn: conn.exec_driver_sql("ANALYZE steps"))
        except StoreError as exc:
            log.warning("could not have the database count the steps again", error=exc.message)

    async def runs_cancelling(self, run_ids: Iterable[int]) -> set[int]:
        """Which of these runs an operator has asked to stop. One statement: the drain
        asks before each refill of its slots from the steps it claimed ahead."""
        ids = sorted(set(run_ids))
        if not ids:
            return set()

        async def work(conn: AsyncConnection) -> set[int]:
            return {int(i) for i in (await conn.execute(_cancelling(self.dialect), {"b_ids": ids})).scalars()}

        result: set[int] = await self._read(work, one_statement=True)
        return result

    async def runs_by_ids(self, run_ids: list[int], *, definition: bool = True) -> list[RunRow]:
        """These runs, in this order. `definition=False` as for `get_run`."""
        query = select(*runs.c) if definition else select(*_RUN_STATE)
        blank: dict[str, Any] = {} if definition else {"definition": {}}

        async def work(conn: AsyncConnection) -> list[RunRow]:
            rows = await conn.execute(query.where(statements.one_of(self.dialect, runs.c.id, run_ids)))
            found = {run.id: run for run in from_rows(RunRow, rows, **blank)}
            missing = [i for i in run_ids if i not in found]
            if missing:
                raise NotFound(f"no run {missing[0]}")
            return [found[i] for i in run_ids]

        result: list[RunRow] = await self._read(work)
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


async def fail_runs(conn: AsyncConnection, errors: dict[int, str], now: datetime) -> None:
    for run_id, error in errors.items():
        await conn.execute(
            update(runs).where(runs.c.id == run_id, runs.c.error.is_(None)).values(error=error, cancel_requested=True)
        )
    await skip_ready_steps(conn, list(errors), now, "run failed")


async def skip_ready_steps(conn: AsyncConnection, run_ids: list[int], now: datetime, why: str) -> None:
    await conn.execute(
        update(steps)
        .where(steps.c.run_id.in_(run_ids), steps.c.status == StepStatus.READY.value)
        .values(status=StepStatus.SKIPPED.value, ended_at=now, error=why)
    )


@cache
def _cancelling(dialect: str) -> Select[Any]:
    """Which of the runs `b_ids` an operator has asked to stop (made once: the drain asks
    before each refill)."""
    stopping = runs.c.cancel_requested.is_(True)
    return select(runs.c.id).where(statements.one_of_param(dialect, runs.c.id, "b_ids"), stopping)


# A run moved on: its phase and state as the engine decided them, given only if the run
# is still where the engine saw it (its phase, materialised phase and a live status).
_ADVANCED = {
    "b_phase": runs.c.phase,
    "b_materialised": runs.c.materialised_phase,
    "b_due": runs.c.phase_due_at,
    "b_ends": runs.c.ends_at,
    "b_status": runs.c.status,
    "b_started": runs.c.started_at,
    "b_ended": runs.c.ended_at,
}
_ADVANCING = {
    "b_id": runs.c.id,
    "b_old_phase": runs.c.phase,
    "b_old_materialised": runs.c.materialised_phase,
} | _ADVANCED


@cache
def _advancing(dialect: str, fixed: tuple[str, ...]) -> Update:
    """`advance_runs`' moves, each run with its own values (`_ADVANCING`, from `many_rows`):
    on PostgreSQL one statement for all of them, where an executemany sent one a run."""
    c, moved = runs.c, statements.many_rows(dialect, _ADVANCING, fixed)
    return (
        update(runs)
        .where(
            c.id == moved["b_id"],
            c.phase == moved["b_old_phase"],
            c.materialised_phase == moved["b_old_materialised"],
            # (an IN list cannot be used with executemany)
            or_(c.status == RunStatus.PENDING.value, c.status == RunStatus.RUNNING.value),
        )
        .values({column: moved[name] for name, column in _ADVANCED.items()})
    )

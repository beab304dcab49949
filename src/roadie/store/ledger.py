"""The ledger: recording resources, and reading what a run holds."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING

from sqlalchemy import (
    Insert,
    Update,
    func,
    or_,
    select,
    tuple_,
    update,
)

from roadie.errors import InvalidState, NotFound, StoreError
from roadie.log import get_logger
from roadie.states import (
    CleanupStatus,
    ResourceState,
    StepStatus,
)
from roadie.store import dialects, statements
from roadie.store.audit import record_audit
from roadie.store.connector import Connector, after_commit, chunks
from roadie.store.records import LiveGroup, NewResource, Outcome
from roadie.store.rows import ResourceRow, StepRow, from_row, from_rows
from roadie.store.tables import (
    LIVE_STATES,
    run_resources,
    runs,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

log = get_logger(__name__)
FRESHEN_ABOVE = 10_000  # live rows of one run past which stale statistics cost a cleanup dearly


class LedgerQueries(Connector):
    async def get_resource(self, resource_id: int) -> ResourceRow:
        async def work(conn: AsyncConnection) -> ResourceRow:
            row = (await conn.execute(select(run_resources).where(run_resources.c.id == resource_id))).first()
            if row is None:
                raise NotFound(f"no resource {resource_id}")
            return from_row(ResourceRow, row)

        result: ResourceRow = await self._read(work)
        return result

    async def record_late_resources(self, step: StepRow, resources: list[NewResource], now: datetime) -> Outcome:
        """Resources a step's effect made by itself, reported after the step answered.

        Claim: nobody's — and no cleanup may hold the run. Checked in the same transaction
        as the insert, with the run's row locked until the commit: a cleanup claimed
        between the check and the insert could count the rows before these and call the
        run clean. Raises `InvalidState`, recording nothing, once the run's cleanup has
        begun or ended; the module reverts what it reported itself.
        """
        outcome = Outcome(step=step, status=StepStatus(step.status), at=now, resources=resources)
        open_to_record = [
            runs.c.id == step.run_id,
            runs.c.cleanup_status.in_([CleanupStatus.NOT_REQUIRED.value, CleanupStatus.PENDING.value]),
            or_(runs.c.cleanup_token.is_(None), runs.c.cleanup_claim_expires < now),
        ]

        async def work(conn: AsyncConnection) -> None:
            # A write that changes nothing, to lock the row: a locking read is not the same
            # thing on every database, an UPDATE is.
            held = await conn.execute(
                update(runs).where(*open_to_record).values(cleanup_attempts=runs.c.cleanup_attempts)
            )
            if held.rowcount != 1:
                raise InvalidState(f"run {step.run_id}'s cleanup has begun or ended; revert these yourself")
            await record_resources(conn, self.dialect, [outcome])

        await self._write("record_late_resources", work)
        return outcome

    async def list_resources(
        self,
        run_id: int,
        *,
        live_only: bool = False,
        state: ResourceState | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[ResourceRow]:
        """A run's ledger rows in the order recorded; a page of them is `limit` rows with ids
        past `after` (keyset: a row recorded meanwhile neither shifts nor repeats a page)."""
        query = (
            select(run_resources)
            .where(run_resources.c.run_id == run_id, run_resources.c.id > after)
            .order_by(run_resources.c.id)
            .limit(limit)
        )
        if live_only:
            query = query.where(run_resources.c.state.in_(LIVE_STATES))
        if state is not None:
            query = query.where(run_resources.c.state == state.value)

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return from_rows(ResourceRow, await conn.execute(query))

        result: list[ResourceRow] = await self._read(work)
        return result

    async def reverted_rows(
        self, run_id: int, *, after: int = 0, limit: int = 5000, member_key: str | None = None
    ) -> list[ResourceRow]:
        """A page of a run's reverted rows (resources, restored leases, placeholders
        reverted by key), by id: what a cleanup's verification reads back."""
        conditions = [
            run_resources.c.run_id == run_id,
            run_resources.c.state == ResourceState.REVERTED.value,
            run_resources.c.id > after,
        ]
        if member_key is not None:
            conditions.append(run_resources.c.member_key == member_key)
        query = select(run_resources).where(*conditions).order_by(run_resources.c.id).limit(limit)

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return from_rows(ResourceRow, await conn.execute(query))

        result: list[ResourceRow] = await self._read(work)
        return result

    async def count_live_resources(self, run_id: int, *, member_key: str | None = None) -> int:
        query = select(func.count()).where(run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES))
        if member_key is not None:
            query = query.where(run_resources.c.member_key == member_key)

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar() or 0)

        result: int = await self._read(work)
        return result

    async def freshen_ledger_statistics(self, run_id: int) -> bool:
        """On PostgreSQL, bring the planner's statistics of the ledger up to date when this
        run's live rows outnumber what they know of (a run that filled the ledger faster
        than autovacuum looks, within a minute or so). Without them the planner takes the
        ledger for small, and reads each page of a cleanup by walking every live row.
        Best effort: a role that may not ANALYZE the table leaves it to autovacuum. True
        when the statistics were brought up to date."""
        if self.dialect != "postgresql":
            return False

        async def stale(conn: AsyncConnection) -> bool:
            counted = select(func.count()).where(
                run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES)
            )
            live = int((await conn.execute(counted)).scalar() or 0)
            if live <= FRESHEN_ABOVE:
                return False
            known = await conn.exec_driver_sql("SELECT reltuples FROM pg_class WHERE oid = 'run_resources'::regclass")
            return float(known.scalar() or 0) < live / 2  # (-1: never analyzed)

        if not await self._read(stale):
            return False

        async def work(conn: AsyncConnection) -> None:
            await conn.exec_driver_sql("ANALYZE run_resources")

        try:
            await self._write("analyze_ledger", work)
        except StoreError as exc:
            log.info("ledger statistics left to autovacuum", error=exc.message)
            return False
        return True

    async def live_rows_page(
        self, run_id: int, *, member_key: str | None, before: int | None, limit: int
    ) -> list[ResourceRow]:
        """Up to `limit` live rows of a run, newest first, older than row `before`: a page
        read along the (run, id) index, whatever the size of the run."""
        query = (
            select(run_resources)
            .where(run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES))
            .order_by(run_resources.c.id.desc())
            .limit(limit)
        )
        if member_key is not None:
            query = query.where(run_resources.c.member_key == member_key)
        if before is not None:
            query = query.where(run_resources.c.id < before)

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return from_rows(ResourceRow, await conn.execute(query))

        result: list[ResourceRow] = await self._read(work)
        return result

    async def live_summary(self, run_id: int, *, member_key: str | None = None, newest: int = 3) -> list[LiveGroup]:
        """What a run (or one member) still holds, by module and kind: the count, and the
        `newest` few rows of each. One grouped count, then a short read per group."""
        live = [run_resources.c.run_id == run_id, run_resources.c.state.in_(LIVE_STATES)]
        if member_key is not None:
            live.append(run_resources.c.member_key == member_key)
        counted = (
            select(run_resources.c.owner, run_resources.c.kind, func.count().label("n"))
            .where(*live)
            .group_by(run_resources.c.owner, run_resources.c.kind)
            .order_by(run_resources.c.owner, run_resources.c.kind)
        )

        async def work(conn: AsyncConnection) -> list[LiveGroup]:
            groups = []
            for owner, kind, n in (await conn.execute(counted)).all():
                rows: list[ResourceRow] = []
                if newest:  # the counts alone (a cap's check) read no row
                    query = (
                        select(run_resources)
                        .where(*live, run_resources.c.owner == owner, run_resources.c.kind == kind)
                        .order_by(run_resources.c.id.desc())
                        .limit(newest)
                    )
                    rows = from_rows(ResourceRow, await conn.execute(query))
                groups.append(LiveGroup(owner, kind, int(n), rows))
            return groups

        result: list[LiveGroup] = await self._read(work)
        return result

    async def live_targets(self, targets: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        """Which of these (owner, kind, ref) a live or pending ledger row holds."""

        async def work(conn: AsyncConnection) -> set[tuple[str, str, str]]:
            return set(await live_holders(conn, targets))

        result: set[tuple[str, str, str]] = await self._read(work)
        return result

    async def live_rows_of_steps(
        self, run_id: int, step_ids: list[int | None], *, member_key: str | None, before: int | None = None
    ) -> list[ResourceRow]:
        """The live rows of these steps (None: the run's rows of no step), newest first;
        only those older than row `before` when it is given.

        Read by step, along the (step, state) index: a step's id names its run, and a
        condition on the run or on ids would tempt SQLite's planner to the (run, id) index
        and a walk through every older row of the run."""
        ids = [s for s in step_ids if s is not None]
        queries = []
        if ids:
            queries.append(select(run_resources).where(run_resources.c.step_id.in_(ids)))
        if None in step_ids:
            queries.append(
                select(run_resources).where(run_resources.c.run_id == run_id, run_resources.c.step_id.is_(None))
            )
        live = run_resources.c.state.in_(LIVE_STATES)
        queries = [q.where(live) for q in queries]
        if member_key is not None:
            queries = [q.where(run_resources.c.member_key == member_key) for q in queries]

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            rows = [from_row(ResourceRow, r) for q in queries for r in await conn.execute(q)]
            return [r for r in rows if before is None or r.id < before]

        result: list[ResourceRow] = await self._read(work)
        result.sort(key=lambda r: r.id, reverse=True)
        return result

    async def count_all_live_resources(self) -> int:
        """Ledger rows that still hold their target, across every run."""
        query = select(func.count()).where(run_resources.c.state.in_(LIVE_STATES))

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar() or 0)

        result: int = await self._read(work)
        return result

    async def abandon_resource(self, resource_id: int, actor: str, reason: str, now: datetime) -> ResourceRow:
        """An admin's `forget`: the row is kept as `abandoned`, its target freed, and audited.

        Refused while a restorer (the expiry sweeper, or a cleanup) holds the row under a
        claim that has not run out: its restore may be writing the world at this moment,
        and freeing the target then would let another run borrow it and have that
        restore land over the new value. A claim that ran out is let go with the row."""

        async def work(conn: AsyncConnection) -> ResourceRow:
            row = (
                await conn.execute(select(run_resources).where(run_resources.c.id == resource_id).with_for_update())
            ).first()
            if row is None:
                raise NotFound(f"no resource {resource_id}")
            if row.state not in LIVE_STATES:
                raise InvalidState(f"resource {resource_id} is {row.state}, not live")
            if row.claim_token is not None and row.claim_expires is not None and row.claim_expires >= now:
                raise InvalidState(
                    f"resource {resource_id} is being given back (its restorer holds it until "
                    f"{row.claim_expires.isoformat()}); forget it once that is over, if it is still live"
                )
            changed = await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.state.in_(LIVE_STATES),
                    or_(run_resources.c.claim_token.is_(None), run_resources.c.claim_expires < now),
                )
                .values(
                    state=ResourceState.ABANDONED.value,
                    updated_at=now,
                    error=f"forgotten by {actor}: {reason}",
                    claim_token=None,
                    claim_expires=None,
                )
            )
            if changed.rowcount != 1:
                raise InvalidState(f"resource {resource_id} changed while it was being forgotten; try again")
            await record_audit(
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


async def live_holders(
    conn: AsyncConnection, targets: list[tuple[str, str, str]]
) -> dict[tuple[str, str, str], ResourceRow]:
    found: dict[tuple[str, str, str], ResourceRow] = {}
    for chunk in chunks(targets, 100):
        query = select(run_resources).where(
            tuple_(run_resources.c.owner, run_resources.c.kind, run_resources.c.ref).in_(list(chunk)),
            run_resources.c.state.in_(LIVE_STATES),
        )
        for r in await conn.execute(query):
            found[(r.owner, r.kind, r.ref)] = from_row(ResourceRow, r)
    return found


class MarkedRuns:
    """The runs a store has seen marked as having something to clean up, once the mark
    was committed. Nothing but a run's creation sets `not_required`, so a run here is
    never to be marked again: the drain's transactions, many a second with a few steps
    each when its module is slow, would otherwise each spend a statement marking runs
    that are marked already. Bounded: forgetting costs only a mark made again."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._known: set[int] = set()

    def unmarked(self, run_ids: Iterable[int]) -> list[int]:
        return sorted(set(run_ids) - self._known)

    def remember(self, run_ids: list[int]) -> None:
        if len(self._known) + len(run_ids) > self.LIMIT:
            self._known.clear()
        self._known.update(run_ids)


async def mark_dirty(conn: AsyncConnection, run_ids: Iterable[int], marked: MarkedRuns | None = None) -> None:
    """There is now something to clean up. Guarded: never walks a run back from
    `complete` or `incomplete`; only a human's "clean up again" does that. The runs
    `marked` knows are skipped, and it learns these once they are committed."""
    ids = marked.unmarked(run_ids) if marked is not None else sorted(set(run_ids))
    if ids:
        await conn.execute(_marking(conn.dialect.name), {"b_ids": ids})
        if marked is not None:
            after_commit(conn, lambda: marked.remember(ids))


@cache
def _with_holders(statement: Insert) -> Insert:
    """An insert of resources that returns the targets it inserted and their runs (made
    once for each statement `insert_rows` makes)."""
    cols = run_resources.c
    return statement.returning(cols.owner, cols.kind, cols.ref, cols.run_id)


@cache
def _marking(dialect: str) -> Update:
    """`mark_dirty`'s statement, made once (its runs are the parameter `b_ids`)."""
    return (
        update(runs)
        .where(
            statements.one_of_param(dialect, runs.c.id, "b_ids"),
            runs.c.cleanup_status == CleanupStatus.NOT_REQUIRED.value,
        )
        .values(cleanup_status=CleanupStatus.PENDING.value)
    )


async def record_resources(
    conn: AsyncConnection, dialect: str, outcomes: list[Outcome], marked: MarkedRuns | None = None
) -> None:
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
    statement, parameters = statements.insert_rows(dialect, run_resources, rows, ignore=True)
    if dialects.returning_update(dialect):
        # The rows that went in are this batch's; only the targets refused by the key
        # need a look at who holds them.
        returned = await conn.execute(_with_holders(statement), parameters)
        # Unpacked, not read by name: a row's attribute is found only after an
        # AttributeError raised and caught inside SQLAlchemy's Row, ten times the cost.
        inserted = {(owner, kind, ref): int(run_id) for owner, kind, ref, run_id in returned}
    else:
        await conn.execute(statement, parameters)
        inserted = {}
    holders = await live_holders(conn, [t for t in targets if t not in inserted])
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
    await mark_dirty(conn, dirty, marked)

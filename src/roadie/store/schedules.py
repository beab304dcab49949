"""Schedules: where each event's schedule stands."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import (
    and_,
    delete,
    func,
    select,
    update,
)

from roadie.store import statements
from roadie.store.audit import record_audit
from roadie.store.connector import Connector
from roadie.store.rows import EventRow, ScheduleRow, from_row
from roadie.store.tables import (
    audit,
    events,
    schedules,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

REFUSED = "schedule.refused"


class ScheduleQueries(Connector):
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
            insert = statements.insert_ignore(self.dialect, schedules)
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

    async def note_schedule_refusal(self, event: EventRow, schedule_key: str, error: str, now: datetime) -> bool:
        """Record in the audit trail that the schedule of `event` cannot start its runs,
        once per version: False, writing nothing, when that is recorded since the newest
        version was applied (by this worker or another), so a refusal met at every poll
        is told once, and a new version is judged afresh."""
        subject = f"event:{event.event_id}"
        applied = (
            select(func.max(audit.c.id)).where(audit.c.subject == subject, audit.c.action == "event.apply")
        ).scalar_subquery()
        told = (
            select(audit.c.id)
            .where(audit.c.subject == subject, audit.c.action == REFUSED, audit.c.id > func.coalesce(applied, 0))
            .limit(1)
        )

        async def seen(conn: AsyncConnection) -> bool:
            return (await conn.execute(told)).first() is not None

        async def work(conn: AsyncConnection) -> bool:
            if await seen(conn):
                return False
            detail = {"version": event.version, "schedule_key": schedule_key, "error": error[:2000]}
            await record_audit(conn, now, "schedule", REFUSED, subject, detail)
            return True

        if await self._read(seen):  # the usual case once told: no write at every poll
            return False
        result: bool = await self._write("note_schedule_refusal", work)
        return result

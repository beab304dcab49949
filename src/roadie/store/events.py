"""Events: every version of every event definition."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    and_,
    func,
    select,
)

from roadie.errors import NotFound
from roadie.store.audit import record_audit
from roadie.store.connector import Connector
from roadie.store.rows import EventRow, from_row, from_rows
from roadie.store.tables import (
    events,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class EventQueries(Connector):
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
            await record_audit(conn, now, actor, "event.apply", f"event:{event_id}", {"version": version})
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

    async def list_events(self, *, limit: int | None = None, offset: int = 0) -> list[EventRow]:
        """The newest version of every event, by id; a page of them with `limit` and `offset`."""
        newest = select(events.c.event_id, func.max(events.c.version).label("v")).group_by(events.c.event_id).subquery()
        query = (
            select(events)
            .join(newest, and_(events.c.event_id == newest.c.event_id, events.c.version == newest.c.v))
            .order_by(events.c.event_id)
            .limit(limit)
            .offset(offset)
        )

        async def work(conn: AsyncConnection) -> list[EventRow]:
            return from_rows(EventRow, await conn.execute(query))

        result: list[EventRow] = await self._read(work)
        return result

    async def list_event_versions(self, event_id: str, *, limit: int | None = None, offset: int = 0) -> list[EventRow]:
        """Every stored version of one event, newest first; a page of them with `limit` and
        `offset`. `NotFound` when no version of it is stored."""
        of_it = events.c.event_id == event_id
        query = select(events).where(of_it).order_by(events.c.version.desc()).limit(limit).offset(offset)

        async def work(conn: AsyncConnection) -> list[EventRow]:
            found = from_rows(EventRow, await conn.execute(query))
            if not found and (
                offset == 0 or (await conn.execute(select(events.c.id).where(of_it).limit(1))).first() is None
            ):
                raise NotFound(f"no event {event_id!r}")
            return found

        result: list[EventRow] = await self._read(work)
        return result

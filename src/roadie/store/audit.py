"""The audit trail."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    select,
)

from roadie.store.connector import Connector
from roadie.store.rows import AuditRow, from_rows
from roadie.store.tables import (
    audit,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class AuditQueries(Connector):
    async def write_audit(self, now: datetime, actor: str, action: str, subject: str, detail: Any) -> None:
        """One audit entry in a transaction of its own, for what changes no row of ours (a
        sweep reverts objects the ledger never named)."""

        async def work(conn: AsyncConnection) -> None:
            await record_audit(conn, now, actor, action, subject, detail)

        await self._write("write_audit", work)

    async def list_audit(
        self,
        subject: str | None = None,
        limit: int = 100,
        *,
        actor: str | None = None,
        action: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        offset: int = 0,
    ) -> list[AuditRow]:
        """Audit entries, newest first, those matching every filter given: about `subject`
        (`run:7`, `event:raid`), by `actor`, of `action` (or of every action under it:
        `run` takes `run.start` and `run.cancel`), at or after `since`, before `until`."""
        query = select(audit).order_by(audit.c.id.desc()).limit(limit).offset(offset)
        if subject:
            query = query.where(audit.c.subject == subject)
        if actor:
            query = query.where(audit.c.actor == actor)
        if action:
            query = query.where((audit.c.action == action) | audit.c.action.startswith(f"{action}.", autoescape=True))
        if since is not None:
            query = query.where(audit.c.at >= since)
        if until is not None:
            query = query.where(audit.c.at < until)

        async def work(conn: AsyncConnection) -> list[AuditRow]:
            return from_rows(AuditRow, await conn.execute(query))

        result: list[AuditRow] = await self._read(work)
        return result


async def record_audit(
    conn: AsyncConnection, now: datetime, actor: str, action: str, subject: str, detail: Any
) -> None:
    await conn.execute(audit.insert().values(**audit_entry(now, actor, action, subject, detail)))


def audit_entry(now: datetime, actor: str, action: str, subject: str, detail: Any) -> dict[str, Any]:
    """One audit row's values, for inserting many in one statement."""
    return {"at": now, "actor": actor, "action": action, "subject": subject, "detail": detail}

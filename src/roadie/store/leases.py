"""Leases: the saved value of a borrow, and the expiry sweeper's claims."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    func,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from roadie.states import (
    OVERRIDE_KIND,
    ResourceState,
)
from roadie.store.connector import Connector, aware
from roadie.store.rows import (
    ResourceRow,
    from_row,
)
from roadie.store.tables import (
    LIVE_STATES,
    run_resources,
    runs,
)


class LeaseQueries(Connector):
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
            return aware((await conn.execute(query)).scalar())

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

"""Leases: the saved value of a borrow, and the expiry sweeper's claims."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    or_,
    select,
    update,
)

from roadie.errors import ClaimLost
from roadie.states import (
    LEASE_KINDS,
    ResourceState,
)
from roadie.store.cleanups import fence_cleanup, reverted
from roadie.store.connector import Connector
from roadie.store.fences import mint_fence
from roadie.store.records import CleanupClaim
from roadie.store.rows import ResourceRow, from_rows
from roadie.store.tables import (
    LIVE_STATES,
    run_resources,
    runs,
    steps,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class LeaseQueries(Connector):
    async def save_lease_value(
        self, resource_id: int, saved: Any, now: datetime, *, step_id: int, token: str | None
    ) -> Any:
        """Keep the value a lease is about to overwrite, before it is overwritten, and answer
        the value the row keeps.

        The first value saved wins: two borrows of one target by one run share the row, and
        the later one may have read the earlier one's borrowed value, which is not the
        value to give back.

        Claim: the borrowing step's (`step_id`, `token`), unexpired at `now`. Raises
        `ClaimLost`, writing nothing, when it is gone: a worker that lost the step must not
        save what it read, nor go on to write the world.
        """

        async def work(conn: AsyncConnection) -> Any:
            held = (
                await conn.execute(
                    select(steps.c.id)
                    .where(steps.c.id == step_id, steps.c.claim_token == token, steps.c.claim_expires >= now)
                    .with_for_update()
                )
            ).first()
            if token is None or held is None:
                raise ClaimLost(f"step {step_id}'s claim is no longer held by this borrow")
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

    async def values_written(self, run_id: int, ref: str) -> list[Any]:
        """The values a run's borrows of the target `ref` asked to write: what the world
        may show of the run's own doing (several borrows of one target share a row)."""
        query = select(steps.c.params).where(steps.c.run_id == run_id, steps.c.lease_ref == ref)

        async def work(conn: AsyncConnection) -> list[Any]:
            return [r.params.get("value") for r in await conn.execute(query) if isinstance(r.params, dict)]

        result: list[Any] = await self._read(work)
        return result

    async def expired_leases(self, now: datetime, limit: int = 100) -> list[ResourceRow]:
        query = (
            select(run_resources)
            .where(
                run_resources.c.kind.in_(LEASE_KINDS),
                run_resources.c.state == ResourceState.LIVE.value,
                run_resources.c.until.is_not(None),
                run_resources.c.until <= now,
                run_resources.c.attempts < 5,  # after that, cleanup and a human take over
            )
            .order_by(run_resources.c.until)
            .limit(limit)
        )

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return from_rows(ResourceRow, await conn.execute(query))

        result: list[ResourceRow] = await self._read(work)
        return result

    async def claim_expired_lease(self, resource_id: int, token: str, now: datetime, ttl: float) -> int | None:
        """Take the restore of one expired lease under `token`, so one worker restores it;
        answer the claim's fence, or None when it was not taken.

        A guarded update: the row must still be live and past its `until`, held by no
        other restorer (or by one whose claim expired `ttl` after it took it), and its
        run's cleanup must not be in hands: that cleanup restores it. Once taken, the
        cleanup cannot mark the row reverted either (`mark_reverted` skips rows another
        restorer holds), so the target is not freed for another run while this restore
        may still land.
        """
        cleaning = (
            select(runs.c.id)
            .where(
                runs.c.id == run_resources.c.run_id,
                runs.c.cleanup_token.is_not(None),
                runs.c.cleanup_claim_expires >= now,
            )
            .exists()
        )

        async def work(conn: AsyncConnection) -> int | None:
            changed = await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.state == ResourceState.LIVE.value,
                    run_resources.c.until <= now,
                    _free(now),
                    ~cleaning,
                )
                .values(claim_token=token, claim_expires=now + timedelta(seconds=ttl), updated_at=now)
            )
            return await mint_fence(conn) if changed.rowcount else None

        result: int | None = await self._write("claim_expired_lease", work)
        return result

    async def claim_lease_row(self, claim: CleanupClaim, resource_id: int, now: datetime) -> int | None:
        """Take a lease row for its run's cleanup to give back. Claim: the run's cleanup.
        Answers the fence its restore is to carry, minted afresh (the expiry sweeper may
        have held the row meanwhile), or None when another restorer (the expiry sweeper)
        holds the row."""

        async def work(conn: AsyncConnection) -> int | None:
            await fence_cleanup(conn, claim, now)
            changed = await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.run_id == claim.run_id,
                    run_resources.c.state.in_(LIVE_STATES),
                    or_(_free(now), run_resources.c.claim_token == claim.token),
                )
                .values(claim_token=claim.token, claim_expires=now + timedelta(seconds=claim.ttl))
            )
            return await mint_fence(conn) if changed.rowcount else None

        result: int | None = await self._write("claim_lease_row", work)
        return result

    async def mark_lease_restored(self, resource_id: int, token: str, now: datetime) -> None:
        """The expiry sweeper gave the value back: the row is reverted, its target freed.
        Only a live row: one forgotten (abandoned) meanwhile stays abandoned.
        Claim: the row's (`token`). Raises `ClaimLost`, writing nothing, when it is gone."""

        async def work(conn: AsyncConnection) -> None:
            changed = await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.claim_token == token,
                    run_resources.c.state.in_(LIVE_STATES),
                )
                .values(**reverted(now))
            )
            if changed.rowcount != 1:
                raise ClaimLost(f"lease row {resource_id} was taken over before its restore was recorded")

        await self._write("mark_lease_restored", work)

    async def release_lease_row(self, resource_id: int, token: str, error: str, now: datetime) -> None:
        """The sweeper's restore failed: the row stays live with why, and is free again.
        Claim: the row's (`token`); a claim already gone changes nothing."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.claim_token == token,
                    run_resources.c.state.in_(LIVE_STATES),
                )
                .values(
                    error=error[:2000],
                    attempts=run_resources.c.attempts + 1,
                    updated_at=now,
                    claim_token=None,
                    claim_expires=None,
                )
            )

        await self._write("release_lease_row", work)

    async def leases_in_force(self) -> list[ResourceRow]:
        query = (
            select(run_resources)
            .where(run_resources.c.kind.in_(LEASE_KINDS), run_resources.c.state.in_(LIVE_STATES))
            .order_by(run_resources.c.ref)
        )

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return from_rows(ResourceRow, await conn.execute(query))

        result: list[ResourceRow] = await self._read(work)
        return result


def _free(now: datetime) -> ColumnElement[bool]:
    """A row no restorer holds: never claimed, released, or its claim expired."""
    return or_(run_resources.c.claim_token.is_(None), run_resources.c.claim_expires < now)

"""Keeping a running run's setup: the borrows in force, the claim to put one back, and
what staff are told of what the world lost (DESIGN §12; issue 37, item 4)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, or_, select, update

from roadie.states import OVERRIDE_KIND, STEP_KIND, ResourceState, RunStatus, StepStatus
from roadie.store.audit import record_audit
from roadie.store.connector import Connector
from roadie.store.fences import mint_fence
from roadie.store.notify import NewNotification, known_targets, notify, run_payload
from roadie.store.rows import ResourceRow, from_rows
from roadie.store.tables import LIVE_STATES, remote_modules, run_resources, runs, steps

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class Borrow:
    """A lease a running run holds, with the value its newest borrow of it asked for."""

    row: ResourceRow
    wanted: Any


class KeepQueries(Connector):
    async def borrows_in_force(self, limit: int = 500) -> list[Borrow]:
        """The borrows of running runs that wrote the world (their row keeps a saved value),
        oldest first. A layer of a lease that stacks is its stack's to keep, not listed."""
        query = (
            select(run_resources)
            .join(runs, runs.c.id == run_resources.c.run_id)
            .where(
                run_resources.c.kind == OVERRIDE_KIND,
                run_resources.c.state == ResourceState.LIVE.value,
                runs.c.status == RunStatus.RUNNING.value,
            )
            .order_by(run_resources.c.id)
            .limit(limit)
        )

        async def work(conn: AsyncConnection) -> list[Borrow]:
            found = []
            for row in from_rows(ResourceRow, await conn.execute(query)):
                if not (isinstance(row.payload, dict) and "saved" in row.payload):
                    continue
                newest = (
                    select(steps.c.params)
                    .where(
                        steps.c.run_id == row.run_id,
                        steps.c.lease_ref == row.ref,
                        steps.c.status == StepStatus.SUCCEEDED.value,
                    )
                    .order_by(steps.c.id.desc())
                    .limit(1)
                )
                params = (await conn.execute(newest)).scalar()
                if isinstance(params, dict) and "value" in params:
                    found.append(Borrow(row, params["value"]))
            return found

        result: list[Borrow] = await self._read(work)
        return result

    async def claim_borrow_in_force(self, resource_id: int, token: str, now: datetime, ttl: float) -> int | None:
        """Take a running run's borrow to put it back, under `token`; answer the fence its
        write is to carry, or None. Only while the run runs, no restorer holds the row, and
        no step of the run is borrowing the same target right now (its own write comes)."""
        borrowing = (
            select(steps.c.id)
            .where(
                steps.c.run_id == run_resources.c.run_id,
                steps.c.lease_ref == run_resources.c.ref,
                steps.c.status == StepStatus.RUNNING.value,
            )
            .exists()
        )
        running = (
            select(runs.c.id)
            .where(runs.c.id == run_resources.c.run_id, runs.c.status == RunStatus.RUNNING.value)
            .exists()
        )

        async def work(conn: AsyncConnection) -> int | None:
            changed = await conn.execute(
                update(run_resources)
                .where(
                    run_resources.c.id == resource_id,
                    run_resources.c.state == ResourceState.LIVE.value,
                    or_(run_resources.c.claim_token.is_(None), run_resources.c.claim_expires < now),
                    running,
                    ~borrowing,
                )
                .values(claim_token=token, claim_expires=now + timedelta(seconds=ttl))
            )
            return await mint_fence(conn) if changed.rowcount else None

        result: int | None = await self._write("claim_borrow_in_force", work)
        return result

    async def release_borrow(self, resource_id: int, token: str, now: datetime, *, left_alone: Any = None) -> None:
        """Let a borrow in force go after looking at it. `left_alone` (wrapped, as `(value,)`)
        keeps what a person set over it, so that it is told once, not at every look."""

        async def work(conn: AsyncConnection) -> None:
            values: dict[str, Any] = {"claim_token": None, "claim_expires": None}
            if left_alone is not None:
                row = (
                    await conn.execute(select(run_resources.c.payload).where(run_resources.c.id == resource_id))
                ).one()
                values["payload"] = {**(row.payload or {}), "left_alone": left_alone[0]}
            await conn.execute(
                update(run_resources)
                .where(run_resources.c.id == resource_id, run_resources.c.claim_token == token)
                .values(**values)
            )

        await self._write("release_borrow", work)

    async def tell_world(self, run_id: int, what: str, detail: dict[str, Any], now: datetime) -> None:
        """Say what happened to a run's setup in the world: in its audit (the run's page
        shows it) and to the webhooks, as `run.world`. `what` is `reapplied`, `left_alone`
        or `lost`."""

        async def work(conn: AsyncConnection) -> None:
            await record_audit(conn, now, "roadie", f"world.{what}", f"run:{run_id}", detail)
            targets = await known_targets(conn)
            if targets:
                run = (await conn.execute(select(runs).where(runs.c.id == run_id))).one()
                payload = {**run_payload(run), "world": what, **detail}
                key = f"run:{run_id}:world:{what}:{now.isoformat()}:{detail.get('ref', '')}"
                await notify(
                    conn, self.dialect, [NewNotification(key[:190], "run.world", run_id, payload)], targets, now
                )

        await self._write("tell_world", work)

    async def announced_since(self, since: datetime) -> dict[str, datetime]:
        """The pulling modules that announced themselves (a process started) after `since`."""
        query = select(remote_modules.c.name, remote_modules.c.announced_at).where(
            remote_modules.c.announced_at > since
        )

        async def work(conn: AsyncConnection) -> dict[str, datetime]:
            return {r.name: r.announced_at for r in await conn.execute(query)}

        result: dict[str, datetime] = await self._read(work)
        return result

    async def things_in_force(self, owner: str, limit: int = 2000) -> list[ResourceRow]:
        """What running runs' steps made through `owner` and hold live: what a restart of
        its world may have taken away."""
        query = (
            select(run_resources)
            .join(runs, runs.c.id == run_resources.c.run_id)
            .where(
                and_(
                    run_resources.c.owner == owner,
                    run_resources.c.kind != STEP_KIND,
                    run_resources.c.state.in_(LIVE_STATES),
                    runs.c.status == RunStatus.RUNNING.value,
                )
            )
            .order_by(run_resources.c.id)
            .limit(limit)
        )

        async def work(conn: AsyncConnection) -> list[ResourceRow]:
            return from_rows(ResourceRow, await conn.execute(query))

        result: list[ResourceRow] = await self._read(work)
        return result

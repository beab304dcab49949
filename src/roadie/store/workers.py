"""Workers: registration, heartbeats, and what each holds."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    func,
    select,
    tuple_,
    update,
)

from roadie.states import (
    StepStatus,
    WorkerState,
)
from roadie.store.connector import Connector, aware, chunks
from roadie.store.drain import back_to_ready
from roadie.store.rows import (
    WorkerRow,
)
from roadie.store.tables import (
    runs,
    steps,
    workers,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class WorkerQueries(Connector):
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
        self, worker_id: str, now: datetime, ttl: float, *, steps_held: Mapping[int, str] | None = None
    ) -> set[int]:
        """The worker's heartbeat: one transaction per interval, whatever it holds.

        Claim: each of `steps_held` (step id -> the claim token of the attempt in flight).
        The worker is alive, and the attempts it has in flight are still its own: their
        claims now expire `ttl` from now. Only what the worker names is extended, so a
        claim it made and then lost track of (the commit went through, the answer did not)
        still expires and is taken over. Cleanups are not kept alive here: a cleanup
        extends its own claim as it makes progress, so one stuck on a module loses it.

        Answers which of `steps_held` it no longer holds: another worker took them over
        after their claims expired, and their dispatches are to be abandoned, not recorded.
        """
        until = now + timedelta(seconds=ttl)
        pairs = sorted((steps_held or {}).items())

        async def work(conn: AsyncConnection) -> set[int]:
            await conn.execute(
                update(workers)
                .where(workers.c.worker_id == worker_id, workers.c.stopped_at.is_(None))
                .values(heartbeat_at=now)
            )
            held: set[int] = set()
            for chunk in chunks(pairs, 200):
                mine = [
                    tuple_(steps.c.id, steps.c.claim_token).in_(list(chunk)),
                    steps.c.status == StepStatus.RUNNING.value,
                ]
                await conn.execute(update(steps).where(*mine).values(claim_expires=until))
                held.update(int(i) for i in (await conn.execute(select(steps.c.id).where(*mine))).scalars())
            return {i for i, _ in pairs} - held

        result: set[int] = await self._write("heartbeat_worker", work)
        return result

    async def deregister_worker(self, worker_id: str, incarnation: str, now: datetime) -> tuple[int, int]:
        """A worker stops cleanly: it is marked stopped, and gives back what it still holds.

        Claim: the claims this worker's incarnation minted (their tokens begin with
        `incarnation`), not every claim in its name: another process may run under the
        same worker id. A step given back goes to `ready`, and its attempt counts: its
        dispatch may have reached the world (a recording that failed, a dispatch that was
        abandoned), and the retry under the same key is what makes that exact. Cleanups it
        held are released for another worker. Answers (steps released, cleanups released).
        """
        mine = incarnation + "%"

        async def work(conn: AsyncConnection) -> tuple[int, int]:
            await conn.execute(
                update(workers).where(workers.c.worker_id == worker_id).values(stopped_at=now, heartbeat_at=now)
            )
            released = await conn.execute(
                update(steps)
                .where(steps.c.claim_token.like(mine), steps.c.status == StepStatus.RUNNING.value)
                .values(**back_to_ready(now, "the worker running this step stopped"))
            )
            cleanups = await conn.execute(
                update(runs)
                .where(runs.c.cleanup_token.like(mine))
                .values(cleanup_claimed_by=None, cleanup_claim_expires=None, cleanup_token=None)
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
                heartbeat = aware(r.heartbeat_at)
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
                        concurrency=_stored_count(r.concurrency),
                        version=r.version,
                        state=state.value,
                        steps=int(r.steps),
                        cleanups=int(r.cleanups),
                    )
                )
            return found

        result: list[WorkerRow] = await self._read(work)
        return result


def _stored_count(value: Any) -> int:
    """A worker's stored concurrency; 0 for one that is not a number. Before roadie.toml
    was checked, a worker could register `concurrency = "lots"`, which SQLite keeps as
    text: the list must still show every other worker, and this one's state."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0

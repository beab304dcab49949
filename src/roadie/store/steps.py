"""Reads of steps: a run's, and the steps named by keys or ids."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from sqlalchemy import select, tuple_

from roadie.store.connector import Connector, chunks
from roadie.store.rows import StepRow, from_row, from_rows
from roadie.store.tables import runs, steps

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class StepQueries(Connector):
    async def list_steps(self, run_id: int, *, limit: int | None = None, offset: int = 0) -> list[StepRow]:
        query = (
            select(steps)
            .where(steps.c.run_id == run_id)
            .order_by(steps.c.phase, steps.c.seq)
            .limit(limit)
            .offset(offset)
        )

        async def work(conn: AsyncConnection) -> list[StepRow]:
            return from_rows(StepRow, await conn.execute(query))

        result: list[StepRow] = await self._read(work)
        return result

    async def steps_by_keys(self, keys: list[str]) -> list[tuple[StepRow, str, str]]:
        """The steps these idempotency keys name, each with its run's status and cleanup
        status. A key is `nonce-run-phase-seq`: its run is read from it, so the lookup goes
        along the (run, phase, seq) key; a key that is not one of ours names nothing. Each
        step is matched on its whole key: another installation's key may share its (run,
        phase, seq), and must neither name the step nor hide the key that does."""
        wanted: dict[tuple[int, int, int], set[str]] = defaultdict(set)
        for key in keys:
            parts = key.rsplit("-", 3)
            if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
                wanted[int(parts[1]), int(parts[2]), int(parts[3])].add(key)

        async def work(conn: AsyncConnection) -> list[tuple[StepRow, str, str]]:
            found: list[tuple[StepRow, str, str]] = []
            for chunk in chunks(list(wanted), 100):
                query = (
                    select(steps, runs.c.status.label("run_status"), runs.c.cleanup_status.label("run_cleanup"))
                    .join(runs, runs.c.id == steps.c.run_id)
                    .where(tuple_(steps.c.run_id, steps.c.phase, steps.c.seq).in_(chunk))
                )
                for r in await conn.execute(query):
                    if r.idempotency_key in wanted.get((r.run_id, r.phase, r.seq), ()):
                        found.append((from_row(StepRow, r), str(r.run_status), str(r.run_cleanup)))
            return found

        result: list[tuple[StepRow, str, str]] = await self._read(work)
        return result

    async def steps_by_ids(self, step_ids: list[int]) -> list[StepRow]:
        async def work(conn: AsyncConnection) -> list[StepRow]:
            found: list[StepRow] = []
            for chunk in chunks(step_ids):
                found.extend(from_rows(StepRow, await conn.execute(select(steps).where(steps.c.id.in_(list(chunk))))))
            return found

        result: list[StepRow] = await self._read(work)
        return result

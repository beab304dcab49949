"""Cleanups: claiming a run's cleanup, marking rows reverted, its report."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    bindparam,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from roadie.states import (
    CleanupStatus,
    ResourceState,
    RunStatus,
)
from roadie.store.audit import record_audit
from roadie.store.connector import Connector, chunks
from roadie.store.tables import (
    LIVE_STATES,
    run_resources,
    runs,
)


class CleanupQueries(Connector):
    async def record_verification(self, run_id: int, verification: dict[str, Any], actor: str, now: datetime) -> None:
        """Add what a verification found and redid to the run's cleanup report, and audit it."""

        async def work(conn: AsyncConnection) -> None:
            row = (await conn.execute(select(runs.c.cleanup_report).where(runs.c.id == run_id))).first()
            report = dict(row.cleanup_report or {}) if row is not None else {}
            report["verify"] = verification
            await conn.execute(update(runs).where(runs.c.id == run_id).values(cleanup_report=report))
            summary = {k: verification[k] for k in ("verified", "came_back", "redone", "failed") if k in verification}
            await record_audit(conn, now, actor, "verify", f"run:{run_id}", summary)

        await self._write("record_verification", work)

    async def mark_reverted(self, ids: list[int], now: datetime) -> None:
        """Reverted rows stay for history; leaving the live states frees their targets."""
        if not ids:
            return

        async def work(conn: AsyncConnection) -> None:
            for chunk in chunks(ids):
                await conn.execute(
                    update(run_resources)
                    .where(run_resources.c.id.in_(list(chunk)), run_resources.c.state.in_(LIVE_STATES))
                    .values(
                        state=ResourceState.REVERTED.value,
                        reverted_at=now,
                        updated_at=now,
                        error=None,
                        attempts=run_resources.c.attempts + 1,
                    )
                )

        await self._write("mark_reverted", work)

    async def mark_revert_failed(self, failures: dict[int, str], now: datetime) -> None:
        if not failures:
            return

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(run_resources)
                .where(run_resources.c.id == bindparam("b_id"))
                .values(error=bindparam("b_error"), attempts=run_resources.c.attempts + 1, updated_at=now),
                [{"b_id": i, "b_error": e[:2000]} for i, e in failures.items()],
            )

        await self._write("mark_revert_failed", work)

    async def claim_cleanup(
        self, run_id: int, worker: str, now: datetime, ttl: float, *, again: bool, scoped: bool = False
    ) -> bool:
        """Take a run's cleanup, so one worker does it. `again` is a human's retry: it may
        move `complete`/`incomplete` back to `pending` (the only path that does). A
        `scoped` cleanup (one member) leaves the status alone."""

        async def work(conn: AsyncConnection) -> bool:
            values: dict[str, Any] = {
                "cleanup_claimed_by": worker,
                "cleanup_claim_expires": now + timedelta(seconds=ttl),
                "cleanup_attempts": runs.c.cleanup_attempts + 1,
                "cleanup_started_at": now,
            }
            condition = [
                runs.c.id == run_id,
                or_(
                    runs.c.cleanup_claimed_by.is_(None),
                    runs.c.cleanup_claim_expires < now,
                    runs.c.cleanup_claimed_by == worker,
                ),
            ]
            if scoped:
                pass
            elif again:
                values["cleanup_status"] = CleanupStatus.PENDING.value
            else:
                condition.append(runs.c.cleanup_status == CleanupStatus.PENDING.value)
            changed = await conn.execute(update(runs).where(*condition).values(**values))
            return bool(changed.rowcount)

        result: bool = await self._write("claim_cleanup", work)
        return result

    async def extend_cleanup_claim(self, run_id: int, worker: str, now: datetime, ttl: float) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.cleanup_claimed_by == worker)
                .values(cleanup_claim_expires=now + timedelta(seconds=ttl))
            )

        await self._write("extend_cleanup_claim", work)

    async def finish_cleanup(
        self,
        run_id: int,
        worker: str,
        status: CleanupStatus | None,
        report: dict[str, Any],
        actor: str,
        now: datetime,
    ) -> None:
        """Record a cleanup's report and release its claim; `status` None leaves it as it was."""

        async def work(conn: AsyncConnection) -> None:
            values: dict[str, Any] = {
                "cleanup_report": report,
                "cleanup_ended_at": now,
                "cleanup_claimed_by": None,
                "cleanup_claim_expires": None,
            }
            if status is not None:
                values["cleanup_status"] = status.value
            await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
            summary = {k: report[k] for k in ("status", "member_key", "reverted", "restored", "failed") if k in report}
            await record_audit(conn, now, actor, "cleanup", f"run:{run_id}", summary)

        await self._write("finish_cleanup", work)

    async def runs_due_cleanup(self, now: datetime) -> list[int]:
        """Ended runs with `auto` cleanup that are dirty and not being cleaned by anyone."""
        query = (
            select(runs.c.id)
            .where(
                runs.c.status.in_([s.value for s in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)]),
                runs.c.cleanup_policy == "auto",
                runs.c.cleanup_status == CleanupStatus.PENDING.value,
                or_(runs.c.cleanup_claimed_by.is_(None), runs.c.cleanup_claim_expires < now),
            )
            .order_by(runs.c.id)
        )

        async def work(conn: AsyncConnection) -> list[int]:
            return [int(r.id) for r in await conn.execute(query)]

        result: list[int] = await self._read(work)
        return result

"""Cleanups: claiming a run's cleanup, marking rows reverted, its report."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)

from roadie.errors import ClaimLost
from roadie.states import (
    AUTO_CLEANUP_ROUNDS,
    CLEANUP_DUE,
    CleanupPolicy,
    CleanupStatus,
    ResourceState,
    RunStatus,
    Verdict,
    judge_cleanup,
)
from roadie.store.audit import record_audit
from roadie.store.connector import Connector, chunks
from roadie.store.fences import mint_fence
from roadie.store.ledger import live_holders
from roadie.store.notify import notify_cleanup
from roadie.store.records import CleanupClaim
from roadie.store.tables import (
    LIVE_STATES,
    run_resources,
    runs,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class CleanupQueries(Connector):
    async def confirm_cleanup(self, claim: CleanupClaim, actor: str, over: dict[str, Any], now: datetime) -> None:
        """A person confirmed a cleanup that is over a module's cap (`over`: by module, how
        many and the cap): audited under the cleanup's claim before anything is reverted.
        Raises `ClaimLost`, writing nothing, when the claim is gone."""

        async def work(conn: AsyncConnection) -> None:
            await fence_cleanup(conn, claim, now)
            await record_audit(conn, now, actor, "cleanup.confirm", f"run:{claim.run_id}", {"over_cap": over})

        await self._write("confirm_cleanup", work)

    async def reopen_resources(self, claim: CleanupClaim, ids: list[int], why: str, now: datetime) -> list[int]:
        """Rows the world brought back after they were reverted are live again, with `why`
        as their note, so that the ledger says what the world holds and cleanup reverts
        them again; answer the ids reopened. A row whose target another row holds now
        (another run borrowed the setting, or owns the reused id) stays reverted: the
        world's value there is not this run's.

        Claim: the run's cleanup. Raises `ClaimLost`, writing nothing, when it is gone.
        """
        if not ids:
            return []

        async def work(conn: AsyncConnection) -> list[int]:
            await fence_cleanup(conn, claim, now)
            reopened: list[int] = []
            for chunk in chunks(ids):
                rows = (
                    await conn.execute(
                        select(run_resources.c.id, run_resources.c.owner, run_resources.c.kind, run_resources.c.ref)
                        .where(
                            run_resources.c.id.in_(list(chunk)),
                            run_resources.c.run_id == claim.run_id,
                            run_resources.c.state == ResourceState.REVERTED.value,
                        )
                        .with_for_update()
                    )
                ).all()
                held = await live_holders(conn, [(r.owner, r.kind, r.ref) for r in rows])
                free = [r.id for r in rows if (r.owner, r.kind, r.ref) not in held]
                if free:
                    await conn.execute(
                        update(run_resources)
                        .where(run_resources.c.id.in_(free), run_resources.c.state == ResourceState.REVERTED.value)
                        .values(
                            state=ResourceState.LIVE.value,
                            reverted_at=None,
                            updated_at=now,
                            error=why[:2000],
                            claim_token=None,
                            claim_expires=None,
                        )
                    )
                reopened.extend(free)
            return reopened

        result: list[int] = await self._write("reopen_resources", work)
        return result

    async def mark_reverted(
        self, claim: CleanupClaim, ids: list[int], now: datetime, *, failures: dict[int, str] | None = None
    ) -> None:
        """Record a page of reverts in one transaction: the rows in `ids` reverted (kept for
        history; leaving the live states frees their targets), and why each in `failures`
        was not (those stay live, to be tried again).

        Claim: the run's cleanup (`claim`); a lease row must be free or held by the same
        cleanup, never by the expiry sweeper. Raises `ClaimLost`, writing nothing, when the
        cleanup's claim is gone.
        """
        failures = failures or {}
        if not ids and not failures:
            return

        async def work(conn: AsyncConnection) -> None:
            await fence_cleanup(conn, claim, now)
            for chunk in chunks(ids):
                await conn.execute(
                    update(run_resources)
                    .where(
                        run_resources.c.id.in_(list(chunk)),
                        run_resources.c.run_id == claim.run_id,
                        run_resources.c.state.in_(LIVE_STATES),
                        or_(run_resources.c.claim_token.is_(None), run_resources.c.claim_token == claim.token),
                    )
                    .values(**reverted(now))
                )
            if failures:
                await conn.execute(
                    update(run_resources)
                    .where(run_resources.c.id == bindparam("b_id"), run_resources.c.run_id == claim.run_id)
                    .values(
                        error=bindparam("b_error"),
                        attempts=run_resources.c.attempts + 1,
                        updated_at=now,
                        claim_token=None,
                        claim_expires=None,
                    ),
                    [{"b_id": i, "b_error": e[:2000]} for i, e in failures.items()],
                )

        await self._write("mark_reverted", work)

    async def claim_cleanup(
        self, claim: CleanupClaim, worker: str, now: datetime, *, again: bool, scoped: bool = False
    ) -> int | None:
        """Take a run's cleanup under `claim.token`, so one owner does it, and answer the
        fence its reverts are to carry; None when it is not taken. `again` is a
        human's retry: it may move `complete`/`incomplete` back to `pending` (the only path
        that does), and counts the attempts from 1 again, so that the workers give a run it
        finds rolled back its AUTO_CLEANUP_ROUNDS again. A `scoped` cleanup (one member) leaves the status alone.

        `rolled_back` is due again as `pending` is: what came back was reverted, and
        the next round proves it. A claim that is held is refused whoever asks, its own
        worker too: a staff click and the worker beside it in one process are two owners,
        not one.
        """

        async def work(conn: AsyncConnection) -> int | None:
            values: dict[str, Any] = {
                "cleanup_claimed_by": worker,
                "cleanup_token": claim.token,
                "cleanup_claim_expires": now + timedelta(seconds=claim.ttl),
                "cleanup_attempts": runs.c.cleanup_attempts + 1,
                "cleanup_started_at": now,
            }
            condition = [
                runs.c.id == claim.run_id,
                or_(runs.c.cleanup_token.is_(None), runs.c.cleanup_claim_expires < now),
            ]
            if scoped:
                pass
            elif again:
                values["cleanup_status"] = CleanupStatus.PENDING.value
                values["cleanup_attempts"] = 1  # a human's retry begins the rounds anew
            else:
                condition.append(runs.c.cleanup_status.in_(sorted(CLEANUP_DUE)))
            changed = await conn.execute(update(runs).where(*condition).values(**values))
            return await mint_fence(conn) if changed.rowcount else None

        result: int | None = await self._write("claim_cleanup", work)
        return result

    async def extend_cleanup_claim(self, claim: CleanupClaim, now: datetime) -> None:
        """The cleanup goes on: its claim expires `ttl` from now. Raises `ClaimLost` when it
        is no longer held."""

        async def work(conn: AsyncConnection) -> None:
            await fence_cleanup(conn, claim, now)

        await self._write("extend_cleanup_claim", work)

    async def release_cleanup(self, claim: CleanupClaim) -> bool:
        """Give a cleanup's claim back unfinished, for another worker to take at once (this
        one is stopping); what was done under it is recorded already. False when it was no
        longer held."""

        async def work(conn: AsyncConnection) -> bool:
            released = await conn.execute(
                update(runs)
                .where(runs.c.id == claim.run_id, runs.c.cleanup_token == claim.token)
                .values(cleanup_claimed_by=None, cleanup_claim_expires=None, cleanup_token=None)
            )
            return bool(released.rowcount)

        result: bool = await self._write("release_cleanup", work)
        return result

    async def finish_cleanup(
        self,
        claim: CleanupClaim,
        report: dict[str, Any],
        actor: str,
        now: datetime,
        *,
        member_key: str | None = None,
        rolled_back: bool = False,
        held: bool = False,
        found_held: Collection[int] = (),
    ) -> CleanupStatus:
        """Judge how the cleanup ended, record its report and release its claim, in one
        transaction with the count of what is still live, so nothing recorded meanwhile can
        slip between the count and the verdict (late reports wait for the claim to go).

        A report with a verdict has it judged against the status here
        (`judge_cleanup`): *verified clean* only when `complete` with nothing left alone.

        `complete` when nothing is live, or `rolled_back` when the verification found
        the world partially rolled back (`rolled_back`: what came back was reverted
        again, and the next round is to prove it); `held` when it reverted nothing because
        a module had more than its cap to revert (`held`); `incomplete` when something is
        live; still `pending` when all that is live is lease rows another restorer (the
        expiry sweeper) holds, or held when this cleanup came to them (`found_held`), so
        the cleanup is due again to take back what that restorer did not (it may have
        died, its claim running out, or failed and let the row go). A cleanup of one
        member (`member_key`) leaves the run's status as it was, and answers its own.
        Claim: the run's cleanup. Raises `ClaimLost`, writing nothing, when it is gone.
        """

        async def work(conn: AsyncConnection) -> CleanupStatus:
            live = [run_resources.c.run_id == claim.run_id, run_resources.c.state.in_(LIVE_STATES)]
            if member_key is not None:
                live.append(run_resources.c.member_key == member_key)
            remaining = int((await conn.execute(select(func.count()).where(*live))).scalar() or 0)
            held_elsewhere = int(
                (
                    await conn.execute(
                        select(func.count()).where(
                            *live,
                            # Held by another restorer, or by one whose claim ran out or
                            # that let it go since this cleanup found it held: this
                            # cleanup never tried it, and the next one takes it over.
                            or_(
                                and_(
                                    run_resources.c.claim_token.is_not(None),
                                    run_resources.c.claim_token != claim.token,
                                ),
                                run_resources.c.id.in_(sorted(found_held)),
                            ),
                        )
                    )
                ).scalar()
                or 0
            )
            if held:
                status = CleanupStatus.HELD
            elif not remaining:
                status = CleanupStatus.ROLLED_BACK if rolled_back else CleanupStatus.COMPLETE
            elif remaining == held_elsewhere:
                status = CleanupStatus.PENDING
            else:
                status = CleanupStatus.INCOMPLETE
            report["status"] = status.value
            if report.get("verdict"):
                # The verdict never contradicts the status it is told with (DESIGN §12).
                judged = judge_cleanup(Verdict(report["verdict"]), status, int(report.get("left_alone") or 0))
                report["verdict"] = judged.value
                if isinstance(report.get("verification"), dict):
                    report["verification"]["verdict"] = judged.value
            values: dict[str, Any] = {
                "cleanup_report": report,
                "cleanup_ended_at": now,
                "cleanup_claimed_by": None,
                "cleanup_claim_expires": None,
                "cleanup_token": None,
            }
            if member_key is None:
                values["cleanup_status"] = status.value
            released = await conn.execute(
                update(runs).where(runs.c.id == claim.run_id, runs.c.cleanup_token == claim.token).values(**values)
            )
            if released.rowcount != 1:
                raise ClaimLost(f"run {claim.run_id}'s cleanup was taken over before it finished")
            summary = {
                k: report[k]
                for k in ("status", "verdict", "member_key", "reverted", "restored", "failed")
                if k in report
            }
            await record_audit(conn, now, actor, "cleanup", f"run:{claim.run_id}", summary)
            if member_key is None and status is not CleanupStatus.PENDING:
                await notify_cleanup(conn, self.dialect, claim.run_id, claim.token, status.value, report, now)
            return status

        result: CleanupStatus = await self._write("finish_cleanup", work)
        return result

    async def runs_due_cleanup(self, now: datetime) -> list[int]:
        """Ended runs that are dirty with `auto` cleanup, or were found partially rolled
        back fewer than AUTO_CLEANUP_ROUNDS rounds ago, and not being cleaned by anyone."""
        query = (
            select(runs.c.id)
            .where(
                runs.c.status.in_([s.value for s in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)]),
                or_(
                    and_(
                        runs.c.cleanup_policy == CleanupPolicy.AUTO.value,
                        runs.c.cleanup_status == CleanupStatus.PENDING.value,
                    ),
                    and_(
                        runs.c.cleanup_status == CleanupStatus.ROLLED_BACK.value,
                        runs.c.cleanup_attempts < AUTO_CLEANUP_ROUNDS,
                    ),
                ),
                or_(runs.c.cleanup_token.is_(None), runs.c.cleanup_claim_expires < now),
            )
            .order_by(runs.c.id)
        )

        async def work(conn: AsyncConnection) -> list[int]:
            return [int(r.id) for r in await conn.execute(query)]

        result: list[int] = await self._read(work)
        return result


async def fence_cleanup(conn: AsyncConnection, claim: CleanupClaim, now: datetime) -> None:
    """The first statement of every write made under a cleanup's claim: it pushes the
    claim's expiry on only if the claim is still this one, and locks the run's row until
    the commit, so the claim cannot change hands before the writes that follow land."""
    held = await conn.execute(
        update(runs)
        .where(runs.c.id == claim.run_id, runs.c.cleanup_token == claim.token)
        .values(cleanup_claim_expires=now + timedelta(seconds=claim.ttl))
    )
    if held.rowcount != 1:
        raise ClaimLost(f"run {claim.run_id}'s cleanup is no longer held by this cleanup")


def reverted(now: datetime) -> dict[str, Any]:
    """A row given back: kept for history, its target freed, its restorer's claim gone."""
    return {
        "state": ResourceState.REVERTED.value,
        "reverted_at": now,
        "updated_at": now,
        "error": None,
        "attempts": run_resources.c.attempts + 1,
        "claim_token": None,
        "claim_expires": None,
    }

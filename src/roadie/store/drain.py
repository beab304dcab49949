"""The drain: claiming steps with their ledger rows reserved, recording their answers."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Integer,
    Select,
    Update,
    bindparam,
    case,
    func,
    null,
    or_,
    select,
    update,
)

from roadie.errors import ClaimLost
from roadie.states import (
    LAYER_KIND,
    LEASE_KINDS,
    OVERRIDE_KIND,
    STEP_KIND,
    ResourceState,
    Reversible,
    RunStatus,
    StepStatus,
)
from roadie.store import dialects, statements
from roadie.store.connector import Connector, aware, chunks
from roadie.store.executemany import execute_many
from roadie.store.fences import mint_fence
from roadie.store.ledger import MarkedRuns, live_holders, mark_dirty, record_resources
from roadie.store.records import Claimed, Outcome
from roadie.store.rows import StepRow, from_rows
from roadie.store.runs import fail_runs
from roadie.store.tables import (
    LIVE_STATES,
    run_resources,
    runs,
    steps,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

# How an attempt ended, as the step's attempt log says it.
_RESULTS = {StepStatus.SUCCEEDED: "succeeded", StepStatus.READY: "retry", StepStatus.SKIPPED: "cut short"}


class DrainQueries(Connector):
    async def claim_steps(
        self, worker: str, now: datetime, limit: int, claim_ttl: float, *, token: str
    ) -> list[Claimed]:
        """Claim up to `limit` runnable steps and reserve their ledger rows, in one transaction.

        For `ledger` steps that is the placeholder `{@step, key}`; for `override` steps the
        lease's real row. Both are committed before this returns, so every dispatch that
        follows has its durable record (DESIGN §4 rules 1 and 3). A lease whose target
        another run holds is refused here, before the world is touched: its step fails.

        Each claimed attempt carries `token` (minted by the caller for this claim, never
        reused), which every later write about the attempt must name.
        """

        async def work(conn: AsyncConnection) -> list[Claimed]:
            return await self._claim(conn, worker, now, limit, claim_ttl, token)

        result: list[Claimed] = await self._write("claim_steps", work)
        return result

    async def _claim(
        self, conn: AsyncConnection, worker: str, now: datetime, limit: int, claim_ttl: float, token: str
    ) -> list[Claimed]:
        expires = now + timedelta(seconds=claim_ttl)
        if dialects.returning_update(self.dialect):
            given = {"b_now": now, "b_limit": limit, "b_worker": worker, "b_token": token, "b_expires": expires}
            rows = (await conn.execute(_claiming(self.dialect), given)).all()
        else:
            # MariaDB: no UPDATE ... RETURNING, and a locking read over a join would lock
            # the run's row too, so that two workers could never share one run's steps.
            values = {
                "status": StepStatus.RUNNING.value,
                "claimed_by": worker,
                "claim_token": token,
                "claim_expires": expires,
                "attempts": steps.c.attempts + 1,
                "started_at": func.coalesce(steps.c.started_at, now),
            }
            ready = [steps.c.status == StepStatus.READY.value, steps.c.not_before <= now]
            order = (steps.c.not_before, steps.c.id)
            stopped = [
                r.id
                for r in await conn.execute(
                    select(runs.c.id).where(
                        runs.c.cancel_requested.is_(True),
                        runs.c.status.in_([RunStatus.PENDING.value, RunStatus.RUNNING.value]),
                    )
                )
            ]
            query = select(steps.c.id).where(*ready).order_by(*order).limit(limit)
            if stopped:
                query = query.where(steps.c.run_id.not_in(stopped))
            ids = list((await conn.execute(query.with_for_update(skip_locked=True))).scalars())
            if not ids:
                return []
            await conn.execute(update(steps).where(steps.c.id.in_(ids)).values(**values))
            rows = (await conn.execute(select(steps).where(steps.c.id.in_(ids)))).all()
        claimed = sorted((Claimed(step) for step in from_rows(StepRow, rows)), key=lambda c: c.step.id)
        if claimed:
            await self._reserve(conn, claimed, now)
            # Minted last, with every claimed row and reserved target locked: whoever held
            # one of them before minted its own fence earlier.
            fence = await mint_fence(conn)
            for c in claimed:
                c.fence = fence
        return claimed

    async def _reserve(self, conn: AsyncConnection, claimed: list[Claimed], now: datetime) -> None:
        wanted: dict[tuple[str, str, str], list[Claimed]] = {}
        inserts = []
        for c in claimed:
            s = c.step
            if s.reversible == Reversible.LEDGER.value:
                target = (s.owner, STEP_KIND, s.idempotency_key)
                payload: Any = {"action": s.action, "phase": s.phase, "seq": s.seq}
            elif s.reversible == Reversible.OVERRIDE.value and s.lease_ref and s.layered:
                # A layer of a lease that stacks: its own row, whoever else holds the target.
                target = ("core", LAYER_KIND, s.idempotency_key)
                payload = {"lease": s.lease_ref, "priority": s.params["priority"]}
            elif s.reversible == Reversible.OVERRIDE.value and s.lease_ref:
                target = ("core", OVERRIDE_KIND, s.lease_ref)
                payload = None
            else:
                continue
            wanted.setdefault(target, []).append(c)
            inserts.append(
                {
                    "run_id": s.run_id,
                    "step_id": s.id,
                    "owner": target[0],
                    "kind": target[1],
                    "ref": target[2],
                    "payload": payload,
                    "state": ResourceState.PENDING.value,
                    "created_at": now,
                    "updated_at": now,
                    "attempts": 0,
                }
            )
        if not inserts:
            return
        # Two steps of one batch may borrow the same target: one row is inserted, and each
        # claimant is then judged against whoever holds it.
        seen: set[tuple[str, str, str]] = set()
        unique_inserts = []
        for row in inserts:
            key = (row["owner"], row["kind"], row["ref"])
            if key not in seen:
                seen.add(key)
                unique_inserts.append(row)
        await execute_many(conn, *statements.insert_rows(self.dialect, run_resources, unique_inserts, ignore=True))
        # A placeholder's ref is its step's own key, so only that step's earlier attempt can
        # hold it: nothing to look up. A lease's target may be held by anyone.
        holders = await live_holders(conn, [t for t in wanted if t[1] in LEASE_KINDS])
        stacked = await _layered_runs(conn, [t[2] for t in wanted if t[1] == OVERRIDE_KIND])
        refused: dict[int, str] = {}
        dirty: set[int] = {c.step.run_id for t, cs in wanted.items() if t[1] == STEP_KIND for c in cs}
        for target, c in ((t, c) for t, cs in wanted.items() if t[1] in LEASE_KINDS for c in cs):
            holder = holders.get(target)
            if holder is None:  # pragma: no cover - the insert above guarantees a live row
                continue
            if holder.run_id != c.step.run_id:
                c.refused = f"{target[2]} is already held by run {holder.run_id}"
                refused[c.step.id] = c.refused
            elif target[2] in stacked:
                # Its module said the lease stacks when those runs borrowed it: they hold it.
                # A row reserved just now saved nothing and wrote nothing: it goes again.
                if holder.payload is None:
                    await conn.execute(
                        update(run_resources)
                        .where(run_resources.c.id == holder.id)
                        .values(state=ResourceState.REVERTED.value, reverted_at=now, updated_at=now)
                    )
                c.refused = f"{target[2]} is stacked by run {stacked[target[2]]}"
                refused[c.step.id] = c.refused
            else:
                # This step's own earlier attempt, or an earlier borrow of the same target
                # by the same run: either way, the row that is there is the one to use.
                c.reserved_id = holder.id
                dirty.add(c.step.run_id)
        await mark_dirty(conn, dirty, self._marked)
        if refused:
            fatal: dict[int, str] = {}
            for c in claimed:
                if c.step.id in refused:
                    await conn.execute(
                        update(steps)
                        .where(steps.c.id == c.step.id)
                        .values(
                            status=StepStatus.FAILED.value,
                            ended_at=now,
                            claimed_by=None,
                            claim_expires=None,
                            claim_token=None,
                            error=refused[c.step.id],
                            attempt_log=[
                                *(c.step.attempt_log or []),
                                {
                                    "attempt": c.step.attempts,
                                    "at": now.isoformat(),
                                    "ended": now.isoformat(),
                                    "result": "failed",
                                    "error": refused[c.step.id],
                                },
                            ],
                        )
                    )
                    if c.step.on_error == "fail":
                        fatal.setdefault(c.step.run_id, f"step {c.step.name}: {refused[c.step.id]}")
            if fatal:
                await fail_runs(conn, fatal, now)

    async def record_outcomes(self, outcomes: list[Outcome]) -> None:
        """Record a batch of answers in one transaction.

        Claim: each outcome's step must still be held by the attempt that dispatched it
        (`step.claim_token`). That is checked first, with the steps' rows locked until the
        commit; an outcome whose claim was lost (it expired and another worker took the
        step) is marked `stale` and nothing of it is written — not its resources, not its
        placeholder, not its step.

        Resources go in through the live-target key: a target this run already holds is
        "already recorded"; one another run holds becomes a rejection naming that run.
        Then placeholders resolve, leases confirm, steps end or wait for their retry.
        """
        if not outcomes:
            return

        async def work(conn: AsyncConnection) -> None:
            await self._record(conn, outcomes)

        await self._write("record_outcomes", work)

    @cached_property
    def _marked(self) -> MarkedRuns:
        """The runs this store has committed as having something to clean up."""
        return MarkedRuns()

    @property
    def joins_claims(self) -> bool:
        """Whether `record_and_claim` is worth asking for: where the claim is one statement
        (UPDATE ... RETURNING). MariaDB's is three (a locking read, the update, a read
        back), and held inside the recording's transaction they kept its row locks for
        three more round trips: two workers spent three times as long waiting on locks
        and drained 20-40 % fewer steps a second. There the drain claims apart."""
        return dialects.returning_update(self.dialect)

    async def record_and_claim(
        self, outcomes: list[Outcome], worker: str, now: datetime, limit: int, claim_ttl: float, *, token: str
    ) -> list[Claimed]:
        """`record_outcomes`, then `claim_steps`, in one transaction: the drain's commit
        that records a batch also reserves the next, so a batch costs one commit rather
        than two. What is claimed is committed before this returns, as `claim_steps`'s
        is; if the transaction fails, neither is kept. Passes both write points, the
        recording's before the claim's statements."""

        async def work(conn: AsyncConnection) -> list[Claimed]:
            await self._record(conn, outcomes)
            self.write_point("record_outcomes")
            return await self._claim(conn, worker, now, limit, claim_ttl, token)

        result: list[Claimed] = await self._write("claim_steps", work)
        return result

    async def _record(self, conn: AsyncConnection, outcomes: list[Outcome]) -> None:
        held = await _held_steps(conn, self.dialect, outcomes)
        for o in outcomes:
            o.stale = o.step.id not in held
        current = [o for o in outcomes if not o.stale]
        if not current:
            return
        await record_resources(conn, self.dialect, current, self._marked)
        resolved = [o.step.idempotency_key for o in current if o.resolve_placeholder]
        for chunk in chunks(resolved):
            await conn.execute(_resolving(self.dialect), {"b_refs": list(chunk), "b_at": current[0].at})
        for o in current:
            if o.confirm_lease and o.step.lease_ref:
                layer = o.step.layered
                await conn.execute(
                    update(run_resources)
                    .where(
                        run_resources.c.owner == "core",
                        run_resources.c.kind == (LAYER_KIND if layer else OVERRIDE_KIND),
                        run_resources.c.ref == (o.step.idempotency_key if layer else o.step.lease_ref),
                        run_resources.c.run_id == o.step.run_id,
                        run_resources.c.state.in_(LIVE_STATES),
                    )
                    .values(state=ResourceState.LIVE.value, until=_held_until(o.lease_until), updated_at=o.at)
                )
        await self._end_steps(conn, current)
        fatal = {
            o.step.run_id: f"step {o.step.name}: {o.error}"
            for o in current
            if o.status is StepStatus.FAILED and o.step.on_error == "fail"
        }
        if fatal:
            await fail_runs(conn, fatal, current[0].at)

    async def _end_steps(self, conn: AsyncConnection, outcomes: list[Outcome]) -> None:
        params = []
        for o in outcomes:
            entry: dict[str, Any] = {
                "attempt": o.step.attempts,
                "at": (o.started or o.at).isoformat(),
                "ended": o.at.isoformat(),
                "result": _RESULTS.get(o.status, "failed"),
            }
            if o.error:
                entry["error"] = o.error
            params.append(
                {
                    "b_id": o.step.id,
                    "b_token": o.step.claim_token,
                    "b_status": o.status.value,
                    "b_output": o.output,
                    "b_error": o.error,
                    "b_rejections": o.rejections or None,
                    "b_not_before": o.not_before or o.step.not_before,
                    "b_ended_at": o.at if o.status is not StepStatus.READY else None,
                    "b_log": [*(o.step.attempt_log or []), entry],
                }
            )
        fixed, executed = statements.many_rows_params(self.dialect, _ENDING, params)
        ended = await execute_many(conn, _ending(self.dialect, fixed), executed)
        if ended.rowcount != len(params):  # pragma: no cover - the rows are locked since _held_steps
            raise ClaimLost(f"{len(params) - ended.rowcount} of {len(params)} steps changed hands while recording")

    async def requeue_expired_claims(self, now: datetime) -> int:
        """Steps whose worker vanished go back to `ready` under the same key.

        The attempt that was lost counts; a step with no attempts left fails, because a
        worker that keeps dying on it is a failure too, and cleanup must get its turn.
        A claim is expired *at* its expiry, the moment `next_due` names: a worker
        woken then must find the step, or a fake clock would stand still there for ever.
        """

        async def work(conn: AsyncConnection) -> int:
            query = select(
                steps.c.id, steps.c.run_id, steps.c.on_error, steps.c.name, steps.c.attempts, steps.c.max_attempts
            ).where(steps.c.status == StepStatus.RUNNING.value, steps.c.claim_expires <= now)
            query = dialects.skip_locked(self.dialect, query)
            expired = (await conn.execute(query)).all()
            if not expired:
                return 0
            exhausted = [r for r in expired if r.attempts >= r.max_attempts]
            retry = [r.id for r in expired if r.attempts < r.max_attempts]
            lost = "the worker running its last attempt was lost"
            if exhausted:
                await conn.execute(
                    update(steps)
                    .where(steps.c.id.in_([r.id for r in exhausted]))
                    .values(
                        status=StepStatus.FAILED.value,
                        ended_at=now,
                        claimed_by=None,
                        claim_expires=None,
                        claim_token=None,
                        error=lost,
                    )
                )
            for chunk in chunks(retry):
                await conn.execute(
                    update(steps)
                    .where(steps.c.id.in_(list(chunk)))
                    .values(**back_to_ready(now, "the worker running this step was lost"))
                )
            fatal = {r.run_id: f"step {r.name}: {lost}" for r in exhausted if r.on_error == "fail"}
            if fatal:
                await fail_runs(conn, fatal, now)
            return len(expired)

        result: int = await self._write("requeue_expired_claims", work)
        return result

    async def next_due(self) -> datetime | None:
        """The earliest moment something the drain or the lease sweep waits for falls due:
        a ready step's `not_before`, a running step's claim expiry, a live lease's `until`.
        One statement: a worker asks at the end of every tick."""

        async def work(conn: AsyncConnection) -> datetime | None:
            row = (await conn.execute(_NEXT_DUE)).one()
            return min((moment for moment in map(aware, row) if moment is not None), default=None)

        result: datetime | None = await self._read(work, one_statement=True)
        return result


_WRITTEN = {
    "b_status": steps.c.status,
    "b_output": steps.c.output,
    "b_error": steps.c.error,
    "b_rejections": steps.c.rejections,
    "b_not_before": steps.c.not_before,
    "b_ended_at": steps.c.ended_at,
    "b_log": steps.c.attempt_log,
}
_ENDING = {"b_id": steps.c.id, "b_token": steps.c.claim_token} | _WRITTEN


_NEXT_DUE = select(
    select(func.min(steps.c.not_before)).where(steps.c.status == StepStatus.READY.value).scalar_subquery(),
    select(func.min(steps.c.claim_expires)).where(steps.c.status == StepStatus.RUNNING.value).scalar_subquery(),
    select(func.min(run_resources.c.until))
    .where(run_resources.c.kind.in_(LEASE_KINDS), run_resources.c.state == ResourceState.LIVE.value)
    .scalar_subquery(),
)

# The drain's statements are made once per dialect, their values given as parameters:
# making one (SQLAlchemy builds a statement object by object, then walks it for its cache
# key) cost as much as executing it, in every transaction of a drain whose batches are
# small (a module slower than a commit).


@cache
def _ending(dialect: str, fixed: tuple[str, ...]) -> Update:
    """Steps ended, each with its own values (`_ENDING`, from `many_rows`)."""
    c, ending = steps.c, statements.many_rows(dialect, _ENDING, fixed)
    return (
        update(steps)
        .where(
            c.id == ending["b_id"],
            c.status == StepStatus.RUNNING.value,
            # Only the claim that dispatched this attempt may end it: a worker whose
            # claim expired and was taken over answers too late to count.
            c.claim_token == ending["b_token"],
        )
        .values({column: ending[name] for name, column in _WRITTEN.items()})
        .values(claimed_by=None, claim_expires=None, claim_token=None)
    )


@cache
def _holding(dialect: str) -> Select[Any]:
    """Running steps among `b_ids` under any of the claims `b_tokens`, locked."""
    return (
        select(steps.c.id, steps.c.claim_token)
        .where(
            statements.one_of_param(dialect, steps.c.id, "b_ids"),
            statements.one_of_param(dialect, steps.c.claim_token, "b_tokens"),
            steps.c.status == StepStatus.RUNNING.value,
        )
        .with_for_update()
    )


@cache
def _resolving(dialect: str) -> Update:
    """The pending placeholders of the steps whose keys are `b_refs`, resolved at `b_at`."""
    return (
        update(run_resources)
        .where(
            run_resources.c.kind == STEP_KIND,
            statements.one_of_param(dialect, run_resources.c.ref, "b_refs"),
            run_resources.c.state == ResourceState.PENDING.value,
        )
        .values(state=ResourceState.RESOLVED.value, updated_at=bindparam("b_at", type_=run_resources.c.updated_at.type))
    )


@cache
def _claiming(dialect: str) -> Update:
    """Up to `b_limit` runnable steps, due at `b_now`, claimed by `b_worker` under the
    token `b_token` until `b_expires`, and returned (where UPDATE ... RETURNING exists)."""
    now = bindparam("b_now", type_=steps.c.not_before.type)
    runnable = (
        select(steps.c.id)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(
            steps.c.status == StepStatus.READY.value,
            steps.c.not_before <= now,
            runs.c.cancel_requested.is_(False),
        )
        .order_by(steps.c.not_before, steps.c.id)
        .limit(bindparam("b_limit", type_=Integer()))
    )
    runnable = dialects.skip_locked(dialect, runnable, of=steps)
    return (
        update(steps)
        .where(steps.c.id.in_(runnable.scalar_subquery()))
        .values(
            status=StepStatus.RUNNING.value,
            claimed_by=bindparam("b_worker", type_=steps.c.claimed_by.type),
            claim_token=bindparam("b_token", type_=steps.c.claim_token.type),
            claim_expires=bindparam("b_expires", type_=steps.c.claim_expires.type),
            attempts=steps.c.attempts + 1,
            started_at=func.coalesce(steps.c.started_at, now),
        )
        .returning(*steps.c)
    )


async def _held_steps(conn: AsyncConnection, dialect: str, outcomes: list[Outcome]) -> set[int]:
    """The steps of `outcomes` still held by the attempt that answered, locked until the
    transaction ends so that no requeue can take them between the check and the writes.

    Asked as "these ids, under any of these claims" (a claim's token is shared by the steps
    it took, so there are few), and each row's own pair then checked here."""
    pairs = {(o.step.id, o.step.claim_token) for o in outcomes if o.step.claim_token is not None}
    held: set[int] = set()
    for chunk in chunks(sorted(pairs), 200):
        given = {"b_ids": [i for i, _ in chunk], "b_tokens": sorted({t for _, t in chunk})}
        rows = await conn.execute(_holding(dialect), given)
        held.update(int(step_id) for step_id, token in rows if (step_id, token) in pairs)
    return held


def _held_until(until: datetime | None) -> Any:
    """A borrow's expiry as its row keeps it. The first borrow of a row sets it; a later
    borrow of the same target by the same run (it shares the row) may only lengthen it:
    the earlier borrow was promised its time, and no expiry at all is the longest."""
    if until is None:
        return null()
    mine = bindparam(None, until, type_=run_resources.c.until.type)
    return case(
        (run_resources.c.state == ResourceState.PENDING.value, mine),
        (or_(run_resources.c.until.is_(None), run_resources.c.until >= mine), run_resources.c.until),
        else_=mine,
    )


def back_to_ready(now: datetime, why: str) -> dict[str, Any]:
    """A running step given back: ready at once, its claim gone, retried under its key."""
    return {
        "status": StepStatus.READY.value,
        "claimed_by": None,
        "claim_expires": None,
        "claim_token": None,
        "not_before": now,
        "error": f"{why}; retried under the same key",
    }


async def _layered_runs(conn: AsyncConnection, refs: list[str]) -> dict[str, int]:
    """Of the lease targets `refs`, those some run holds a live layer of, and one such run."""
    found: dict[str, int] = {}
    for chunk in chunks(sorted(set(refs))):
        query = (
            select(steps.c.lease_ref, run_resources.c.run_id)
            .join(steps, steps.c.id == run_resources.c.step_id)
            .where(
                run_resources.c.kind == LAYER_KIND,
                run_resources.c.state.in_(LIVE_STATES),
                steps.c.lease_ref.in_(list(chunk)),
            )
        )
        for r in await conn.execute(query):
            found.setdefault(r.lease_ref, r.run_id)
    return found

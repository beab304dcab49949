"""The drain: claim runnable steps (their ledger rows reserved), dispatch them at once,
record their answers in batches, and keep their claims alive while they are in flight.

A worker claims a batch of runnable steps and reserves all their ledger rows in one
transaction before dispatching any of them (still "recorded before dispatched"),
dispatches them concurrently, and records the answers that are in whenever it looks,
one transaction per batch, which on SQLite and PostgreSQL claims the next batch too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import ValidationError

from roadie.definitions import RetryPolicy
from roadie.engine import leases
from roadie.engine.advance import Advance
from roadie.engine.ledger import read_answer
from roadie.errors import (
    ClaimLost,
    PermanentError,
    RoadieError,
    StepError,
    StepTimeout,
    StoreError,
    Superseded,
    UnknownAction,
)
from roadie.log import get_logger
from roadie.registry import Call
from roadie.states import WAIT_ACTION, Reversible, StepStatus
from roadie.store import Claimed, Outcome, dialects, mint_token
from roadie.store.rows import StepRow

log = get_logger(__name__)

RECORD_ATTEMPTS = 20  # consecutive failures to record a batch before the tick gives up
STORE_ATTEMPTS = 10  # attempts of a step whose own bookkeeping the database failed, whatever its retry says
T = TypeVar("T")


class Drain(Advance):
    async def _drain(self) -> bool:
        """Claim, dispatch and record until nothing is runnable now. Answers whether
        anything was dispatched.

        Claims refill the window in batches (when a quarter of it is free, or it is
        empty), and every answer that is in when the worker looks is recorded in one
        transaction: a database commit is the scarce thing, so each one carries as
        many steps as are ready. On SQLite and PostgreSQL the transaction that records a
        batch also claims the slots it frees (committed before any of them is
        dispatched, as a claim of its own is), so a batch costs one commit, not two;
        MariaDB's claim is three statements, and it claims apart. While dispatches are
        still out when it claims (the module is slower than a commit), the window holds
        a few steps more than are dispatched at once (`claim_ahead`, claimed and their
        ledger rows reserved like the others): a slot an answer frees is filled from
        them at once, instead of after the answer is recorded and the next batch
        claimed. Answers that are all in by then (a module as fast as a commit) gain
        nothing from it, and it is not done: holding steps costs a look at cancels
        before each refill.
        A dispatch that ends while a batch is being recorded or claimed frees its slot
        when that commit is done, not at the next one; its answer goes with the next
        batch, which is recorded without waiting for another answer.
        """
        inflight: dict[asyncio.Future[Any], Claimed] = {}
        ahead: deque[Claimed] = deque()  # claimed, not yet dispatched
        heartbeat: asyncio.Task[None] | None = None
        watch: asyncio.Task[None] | None = None  # a look at cancels, while a wait is in flight
        worked = False
        prior: list[Claimed] | None = None  # claimed in the transaction that recorded the last batch
        may_have_moved = True  # whether a run may have a phase to begin or an end to reach
        unrecorded: list[Outcome] = []  # answers whose recording failed, to be recorded again
        carried: list[Outcome] = []  # answers taken in while a batch was recorded or claimed
        failures = 0
        try:
            while True:
                if prior is None:
                    asked, claimed = self._room(inflight, ahead), []
                    if asked:
                        try:
                            claimed = await self.store.claim_steps(
                                self.worker_id,
                                self.clock.now(),
                                asked,
                                self.options.claim_ttl,
                                token=mint_token(self.incarnation),
                            )
                        except StoreError as exc:
                            if not inflight and not unrecorded:
                                raise
                            # The dispatches in flight have written the world: their answers
                            # must still be recorded, so claiming more waits for the next pass.
                            log.warning("claiming steps failed; finishing those in flight", error=exc.message)
                else:
                    claimed, prior = prior, None  # claimed with the batch just recorded
                if asked:
                    # Slots freed while claiming take the new steps now.
                    carried.extend(self._harvest(inflight))
                    for c in claimed:
                        if c.refused:
                            self._tell(
                                "step",
                                {"run_id": c.step.run_id, "step": c.step.name, "status": "failed", "error": c.refused},
                            )
                            may_have_moved = True
                            continue
                        assert c.step.claim_token is not None
                        self._inflight_ids[c.step.id] = c.step.claim_token  # its claim is kept alive from now
                        if c.step.claim_expires is not None:
                            self._claim_expiry[c.step.claim_token] = c.step.claim_expires
                        worked = True
                        if len(inflight) < self.options.concurrency:
                            inflight[asyncio.create_task(self._dispatch(c))] = c
                        else:
                            ahead.append(c)
                    if len(claimed) < asked and may_have_moved:
                        # The queue ran dry: the steps that ended may have finished a phase.
                        may_have_moved = False
                        try:
                            moved, _ = await self._advance()
                        except StoreError as exc:
                            # Moving runs on can wait for the next pass; the dispatches in
                            # flight must not be dropped for it.
                            log.warning("advancing runs failed; will try again", error=exc.message)
                            moved = False
                        if moved:
                            continue
                if not inflight and not unrecorded and not carried:
                    if claimed:
                        continue
                    return worked
                if inflight and not carried:  # answers in hand are recorded without waiting
                    if heartbeat is None or heartbeat.done():
                        heartbeat = asyncio.create_task(self.clock.sleep(self.options.claim_ttl / 3))
                    waits = [c for c in inflight.values() if c.step.action == WAIT_ACTION]
                    if waits and (watch is None or watch.done()):
                        watch = asyncio.create_task(self.clock.sleep(self.options.poll_interval))
                    # Woken when the first claim in flight runs out, unless a beat renews it.
                    lapse = asyncio.create_task(self.clock.sleep(self._claim_left(inflight.values())))
                    awaited = [*inflight, heartbeat, lapse, *([watch] if waits and watch else [])]
                    try:
                        await asyncio.wait(awaited, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        lapse.cancel()
                    # Let dispatches that are about to finish do so, and take them all at once.
                    await asyncio.sleep(0)
                    # Before any beat: a claim that ran out unrenewed is lost to this worker,
                    # whatever a late beat would say.
                    unrecorded.extend(self._cut_lapsed(inflight))
                    if heartbeat.done() and self._heart is None:
                        # Without run_forever's background heartbeat (settle, tests), the
                        # drain beats for what it holds.
                        try:
                            await self.heartbeat()
                        except StoreError as exc:  # a claim outlives two missed beats
                            log.warning("heartbeat failed", worker=self.worker_id, error=exc.message)
                    if self._lost:
                        self._abandon_lost(inflight, ahead)
                    if waits and watch is not None and watch.done():
                        unrecorded.extend(await self._cut_cancelled_waits(inflight))
                outcomes: list[Outcome] = [*unrecorded, *carried, *self._harvest(inflight)]
                carried = []
                # The freed slots are filled before the answers are recorded.
                outcomes.extend(await self._dispatch_ahead(inflight, ahead))
                if outcomes:
                    # The next batch is claimed in the same transaction where the store
                    # joins them, unless the last attempt failed: recording must not wait
                    # on a claim that keeps failing.
                    joined = not failures and self.store.joins_claims
                    asked = self._room(inflight, ahead) if joined else 0
                    try:
                        if asked:
                            prior = await self.store.record_and_claim(
                                outcomes,
                                self.worker_id,
                                self.clock.now(),
                                asked,
                                self.options.claim_ttl,
                                token=mint_token(self.incarnation),
                            )
                        else:
                            await self.store.record_outcomes(outcomes)
                    except StoreError as exc:
                        if dialects.refuses_data(exc):
                            # One answer the database cannot take: the others must not go
                            # back to be dispatched again because of it.
                            outcomes = await self._record_apart(outcomes)
                        else:
                            # The answers are in hand and the world has been written: keep
                            # them and record them again, rather than let their claims
                            # expire and the steps run a second time.
                            failures += 1
                            if failures >= RECORD_ATTEMPTS:
                                raise
                            log.warning(
                                "recording answers failed; trying again", error=exc.message, steps=len(outcomes)
                            )
                            unrecorded = outcomes
                            await asyncio.sleep(self.options.record_pause * failures)
                            continue
                    unrecorded, failures = [], 0
                    for o in outcomes:
                        if o.stale:
                            log.warning("claim lost; answer not recorded", run_id=o.step.run_id, step_id=o.step.id)
                            continue
                        self._tell_outcome(o)
                    if any(o.status is not StepStatus.READY for o in outcomes):
                        may_have_moved = True
                    if ahead and any(t.done() for t in inflight):
                        # Slots freed while the batch was recorded are filled now, not after
                        # the next claim; their answers go with the next recording.
                        carried.extend(self._harvest(inflight))
                        carried.extend(await self._dispatch_ahead(inflight, ahead))
        finally:
            for task in [*inflight, *([heartbeat] if heartbeat else []), *([watch] if watch else [])]:
                task.cancel()
            for c in [*inflight.values(), *ahead]:
                self._let_go(c.step.id, None)

    def _let_go(self, step_id: int, default: str | None = None) -> str | None:
        """This worker no longer has the step in flight: its claim is not kept alive."""
        token = self._inflight_ids.pop(step_id, default)
        if token is not None:
            self._claim_expiry.pop(token, None)
        return token

    def _claim_until(self, step: StepRow) -> datetime | None:
        """When this worker's claim on the step runs out, as far as its own clock knows:
        from the claim, pushed on by each successful heartbeat."""
        if step.claim_token is None:
            return None
        return self._claim_expiry.get(step.claim_token, step.claim_expires)

    def _claim_left(self, held: Iterable[Claimed]) -> float:
        """Seconds until the first of these claims runs out (0 when one has)."""
        until = [u for u in (self._claim_until(c.step) for c in held) if u is not None]
        if not until:
            return self.options.claim_ttl
        return max(0.0, (min(until) - self.clock.now()).total_seconds())

    def _cut_lapsed(self, inflight: dict[asyncio.Future[Any], Claimed]) -> list[Outcome]:
        """Cut the calls in flight whose claims ran out without a successful heartbeat
        (DESIGN §13): another worker may own the step now, and a call of this worker's
        must not land in the world after it. Each is to be tried again (its answer, if
        the claim was taken over, is not recorded). Answers their outcomes."""
        now = self.clock.now()
        cut: list[Outcome] = []
        for task, c in list(inflight.items()):
            until = self._claim_until(c.step)
            if task.done() or until is None or until > now:
                continue
            log.warning("claim ran out unrenewed; call cut", run_id=c.step.run_id, step_id=c.step.id)
            task.cancel()
            del inflight[task]
            self._let_go(c.step.id)
            started = c.step.started_at or now
            error = "the worker's claim ran out unrenewed: its call was cut"
            cut.append(self._failed(c.step, started, error, retryable=True, at_least=STORE_ATTEMPTS))
        return cut

    def _harvest(self, inflight: dict[asyncio.Future[Any], Claimed]) -> list[Outcome]:
        """The outcomes of the dispatches that have ended, their slots freed."""
        finished = [t for t in inflight if t.done()]
        for t in finished:
            self._let_go(inflight.pop(t).step.id, None)
        return [t.result() for t in finished]

    async def _record_apart(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Record a batch whose data the database refused, half by half, until each answer
        it refuses is alone: that one is recorded as its step's failure instead, without
        its resources (its placeholder stays pending, so cleanup reverts by key what the
        step made; a borrow keeps its saved value to give back). Answers the outcomes as
        recorded. Raises `StoreError` on any other failure: the database is unwell, and
        the caller's retries are for that."""
        if len(outcomes) == 1:
            [o] = outcomes
            try:
                await self.store.record_outcomes(outcomes)
                return outcomes
            except StoreError as exc:
                if not dialects.refuses_data(exc):
                    raise
                log.error("an answer could not be recorded", run_id=o.step.run_id, step_id=o.step.id, error=exc.message)
                failed = Outcome(
                    step=o.step,
                    status=StepStatus.FAILED,
                    at=self.clock.now(),
                    started=o.started,
                    error=f"its answer could not be recorded: {exc.message}"[:2000],
                )
                await self.store.record_outcomes([failed])
                return [failed]
        half = len(outcomes) // 2
        recorded: list[Outcome] = []
        for part in (outcomes[:half], outcomes[half:]):
            try:
                await self.store.record_outcomes(part)
                recorded.extend(part)
            except StoreError as exc:
                if not dialects.refuses_data(exc):
                    raise
                recorded.extend(await self._record_apart(part))
        return recorded

    async def _cut_cancelled_waits(self, inflight: dict[asyncio.Future[Any], Claimed]) -> list[Outcome]:
        """Cut short the `core.wait`s of runs that are being cancelled: a wait has nothing
        in the world to finish, so its run need not sit out the wait (or its timeout)
        before it ends and is cleaned up. Answers their outcomes, to be recorded."""
        waits = {t: c for t, c in inflight.items() if c.step.action == WAIT_ACTION and not t.done()}
        try:
            stopping = await self.store.runs_cancelling(c.step.run_id for c in waits.values())
        except StoreError as exc:  # the next look will do
            log.warning("looking for cancelled runs failed", error=exc.message)
            return []
        cut = []
        for task, c in waits.items():
            if c.step.run_id in stopping:
                task.cancel()
                del inflight[task]
                self._let_go(c.step.id, None)
                now = self.clock.now()
                cut.append(Outcome(step=c.step, status=StepStatus.SKIPPED, at=now, error="run cancelled: cut short"))
        return cut

    def _abandon_lost(self, inflight: dict[asyncio.Future[Any], Claimed], ahead: deque[Claimed]) -> None:
        """Stop the dispatches whose claims another worker has taken over, and forget the
        steps claimed ahead that it has: the step is theirs now, and running it here as
        well is what claims exist to prevent."""
        for task, c in list(inflight.items()):
            if c.step.id in self._lost:
                log.warning("claim lost; dispatch abandoned", run_id=c.step.run_id, step_id=c.step.id)
                task.cancel()
                del inflight[task]
                self._let_go(c.step.id, None)
        for c in [c for c in ahead if c.step.id in self._lost]:
            log.warning("claim lost before dispatch", run_id=c.step.run_id, step_id=c.step.id)
            ahead.remove(c)
            self._let_go(c.step.id, None)
        self._lost.clear()

    async def _dispatch_ahead(
        self, inflight: dict[asyncio.Future[Any], Claimed], ahead: deque[Claimed]
    ) -> list[Outcome]:
        """Dispatch steps claimed ahead into the free slots. A cancel stops every step not
        yet dispatched, so one whose run is being cancelled is not: it ends skipped. Its
        placeholder is resolved with nothing made only on its first attempt: an earlier
        attempt may have written the world before its answer was lost, and the pending
        placeholder is what makes cleanup revert that by key. Answers those outcomes, to
        be recorded."""
        skipped: list[Outcome] = []
        while ahead and len(inflight) < self.options.concurrency:
            batch = [ahead.popleft() for _ in range(min(len(ahead), self.options.concurrency - len(inflight)))]
            try:
                stopping = await self.store.runs_cancelling(c.step.run_id for c in batch)
            except StoreError as exc:  # as if the cancel came a moment after the dispatch
                log.warning("looking for cancelled runs failed", error=exc.message)
                stopping = set()
            for c in batch:
                if c.step.run_id not in stopping:
                    inflight[asyncio.create_task(self._dispatch(c))] = c
                    continue
                self._let_go(c.step.id, None)
                untouched = Reversible(c.step.reversible) is Reversible.LEDGER and c.step.attempts <= 1
                skipped.append(
                    Outcome(
                        step=c.step,
                        status=StepStatus.SKIPPED,
                        at=self.clock.now(),
                        error="run cancelled",
                        resolve_placeholder=untouched,
                    )
                )
        return skipped

    def _room(self, inflight: dict[asyncio.Future[Any], Claimed], ahead: deque[Claimed]) -> int:
        """How many steps to claim now: none while stopping, or while fewer slots are free
        than a refill's worth and some dispatch is still out."""
        if self._stopping.is_set():
            return 0
        slow = any(not t.done() for t in inflight)
        free = self.options.concurrency + (self._claim_ahead() if slow else 0) - len(inflight) - len(ahead)
        refill = max(1, self.options.concurrency // 4)
        return free if free > 0 and (free >= refill or not inflight) else 0

    def _claim_ahead(self) -> int:
        ahead = self.options.claim_ahead
        return max(1, self.options.concurrency // 2) if ahead is None else max(0, ahead)

    async def heartbeat(self) -> None:
        """Say this worker is alive and extend the claims of what it holds, in one write."""
        held = dict(self._inflight_ids)
        now = self.clock.now()
        lost = await self.store.heartbeat_worker(self.worker_id, now, self.options.claim_ttl, steps_held=held)
        # Only the attempt the beat asked about: one that ended meanwhile, and was claimed
        # again by this worker, is a new claim (a new token) the beat did not see.
        self._lost |= {i for i in lost if self._inflight_ids.get(i) == held[i]}
        until = now + timedelta(seconds=self.options.claim_ttl)
        for step_id, token in held.items():
            if step_id not in lost and token in self._claim_expiry:
                self._claim_expiry[token] = until

    async def _beat_forever(self) -> None:
        """run_forever's heartbeat, every third of a claim's lifetime, busy or idle."""
        while True:
            await self.clock.sleep(self.options.claim_ttl / 3)
            try:
                await self.heartbeat()
            except StoreError as exc:  # the next beat may get through; a claim lasts three
                log.warning("heartbeat failed", worker=self.worker_id, error=exc.message)

    async def _dispatch(self, claimed: Claimed) -> Outcome:
        """Call the step's action and say what happened. Never raises: every failure is an
        outcome, retried or final."""
        step = claimed.step
        started = self.clock.now()
        until = self._claim_until(step)
        needs = min(step.timeout, self.options.claim_ttl / 3)  # its deadline, or until the next beat
        if until is not None and (until - started).total_seconds() < needs:
            # No call starts with less claim time left than it needs (DESIGN §13): a step
            # held ahead while the heartbeat failed goes back, untouched, to be tried again.
            error = f"not started: its claim had {max(0.0, (until - started).total_seconds()):g}s left"
            return self._failed(step, started, error, retryable=True, at_least=STORE_ATTEMPTS)
        self._tell("step", {"run_id": step.run_id, "step": step.name, "status": "running", "attempt": step.attempts})
        try:
            action = self.registry.action(step.action)
            if action.borrows:
                assert claimed.reserved_id is not None
                outcome: Outcome = await self._with_timeout(
                    leases.borrow(
                        self.store, self.registry, self.clock, step, claimed.reserved_id, fence=claimed.fence
                    ),
                    step.timeout,
                )
                outcome.started = started
                return outcome
            try:
                params = action.params.model_validate(step.params)
            except ValidationError as exc:
                raise PermanentError(f"parameters no longer fit {action.id}: {exc}") from exc
            call = Call(
                run_id=step.run_id,
                step_id=step.id,
                idempotency_key=step.idempotency_key,
                attempt=step.attempts,
                params=params,
                state=self.registry.state(action.module.name),
                clock=self.clock,
                fence=claimed.fence,
            )
            raw = await self._with_timeout(action.call(call), step.timeout)
        except UnknownAction as exc:
            return self._failed(step, started, f"{exc.message}: its module is not loaded", retryable=False)
        except StepError as exc:
            return self._failed(
                step, started, exc.message or type(exc).__name__, retryable=exc.retryable, delay=exc.next_retry_delay
            )
        except Superseded as exc:
            # The module has acted for the step under a newer claim's fence: this attempt's
            # claim was taken over. Nothing was done; what the step records is the newer one's.
            log.warning("superseded", run_id=step.run_id, step_id=step.id, error=exc.message)
            return self._failed(step, started, f"superseded: {exc.message}", retryable=True, at_least=STORE_ATTEMPTS)
        except ClaimLost as exc:
            # A write made for the step found its claim gone: another worker has it.
            return self._failed(step, started, exc.message, retryable=True, at_least=STORE_ATTEMPTS)
        except StoreError as exc:
            # Roadie's own database failed under the step (a borrow keeps the value it
            # will give back before it writes the world; a layer changes its stack under
            # a claim): the borrow is made to be carried out again, and a database
            # failing over is no fault of the step, so it is retried even past its own
            # attempts, up to STORE_ATTEMPTS.
            return self._failed(step, started, exc.message, retryable=True, at_least=STORE_ATTEMPTS)
        except RoadieError as exc:
            return self._failed(step, started, exc.message, retryable=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A module that raised may have acted before it did: retry under the same key,
            # which the module's key ledger makes exact.
            return self._failed(step, started, f"{type(exc).__name__}: {exc}", retryable=True)
        ledgered = Reversible(step.reversible) is Reversible.LEDGER
        answer = read_answer(raw, step.action, ledgered=ledgered, registry=self.registry)
        for reason in answer.rejections:
            log.warning("module answer rejected", run_id=step.run_id, step_id=step.id, reason=reason)
        return Outcome(
            step=step,
            status=StepStatus.SUCCEEDED,
            at=self.clock.now(),
            started=started,
            output=answer.output,
            resources=answer.resources,
            rejections=answer.rejections,
            resolve_placeholder=ledgered and answer.readable,
        )

    async def _with_timeout(self, work: Awaitable[T], seconds: float) -> T:
        """Await `work` for at most `seconds` of the engine's clock."""
        try:
            async with self.clock.timeout(seconds):
                return await work
        except TimeoutError:
            raise StepTimeout(f"no answer within {seconds:g}s") from None

    def _failed(
        self,
        step: StepRow,
        started: datetime,
        error: str,
        *,
        retryable: bool,
        delay: float | None = None,
        at_least: int = 0,
    ) -> Outcome:
        now = self.clock.now()
        if retryable and step.attempts < max(step.max_attempts, at_least):
            if delay is None:
                delay = RetryPolicy.model_validate(step.retry).delay(step.attempts, self.random.random())
            log.info("step will be retried", run_id=step.run_id, step_id=step.id, error=error, delay=delay)
            return Outcome(
                step=step,
                status=StepStatus.READY,
                at=now,
                started=started,
                error=error,
                not_before=now + timedelta(seconds=delay),
            )
        if retryable:
            error = f"{error} (gave up after {step.attempts} attempts)"
        log.warning("step failed", run_id=step.run_id, step_id=step.id, error=error)
        return Outcome(step=step, status=StepStatus.FAILED, at=now, started=started, error=error)

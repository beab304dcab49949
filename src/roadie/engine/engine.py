"""The run engine: materialise, drain, record, advance, clean up.

One `Engine` is one worker. Everything it knows between two moments is in the database,
so an engine abandoned at any point (a crash) is replaced by a fresh one on the same
files, which carries on: claims of the dead worker expire and their steps are retried
under the same idempotency keys.

The drain is built for throughput. A worker claims a batch of runnable steps and reserves
all their ledger rows in one transaction before dispatching any of them (still "recorded
before dispatched"), dispatches them concurrently, and records the answers that are in
whenever it looks, one transaction per batch.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import metadata
from typing import Any, TypeVar, overload

import structlog
from pydantic import ValidationError

from roadie.clock import Clock, FakeClock, SystemClock
from roadie.definitions import FrozenDefinition, RetryPolicy
from roadie.engine import leases, runs, schedules
from roadie.engine.cleanup import Cleanup, CleanupReport
from roadie.engine.ledger import read_answer
from roadie.errors import (
    InvalidState,
    PermanentError,
    RoadieError,
    StepError,
    StepTimeout,
    StoreError,
    UnknownAction,
)
from roadie.registry import Call, Registry
from roadie.states import CleanupPolicy, CleanupStatus, Reversible, RunStatus, StepStatus
from roadie.store import Claimed, NewStep, Outcome, RunMove, Store, mint_token
from roadie.store.rows import EventRow, RunRow, StepRow

log = structlog.get_logger(__name__)

Observer = Callable[[str, dict[str, Any]], None]
RECORD_ATTEMPTS = 20  # consecutive failures to record a batch before the tick gives up
T = TypeVar("T")


@dataclass
class EngineOptions:
    concurrency: int = 32
    claim_ttl: float = 60.0  # a worker that stops heartbeating loses its claims after this
    poll_interval: float = 1.0
    seed: int | None = None
    cleanups: int = 4  # automatic cleanups a worker runs at once, beside its drain


class Engine:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        clock: Clock | None = None,
        worker_id: str | None = None,
        options: EngineOptions | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock or registry.clock or SystemClock()
        self.worker_id = worker_id or f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
        self.options = options or EngineOptions()
        self.random = random.Random(self.options.seed)
        # This engine's claims are minted from its incarnation, not its worker id: two
        # engines under one id (a web service beside its worker) are still two owners.
        self.incarnation = secrets.token_hex(6)
        self.cleanup = Cleanup(
            store, registry, self.clock, self.worker_id, self.options.claim_ttl * 5, incarnation=self.incarnation
        )
        self.observer: Observer = observer or (lambda kind, data: None)
        self._stopping = asyncio.Event()
        self._definitions: dict[int, FrozenDefinition] = {}
        # What the heartbeat keeps claimed: the steps in flight and the cleanups under way.
        self._inflight_ids: dict[int, str] = {}  # step id -> the claim token of the attempt in flight
        self._cleanups: dict[int, asyncio.Task[None]] = {}  # automatic cleanups under way, by run
        self._lost: set[int] = set()  # steps the heartbeat found taken over by another worker
        self._heart: asyncio.Task[None] | None = None  # run_forever's background heartbeat

    # -- runs -----------------------------------------------------------------------

    @overload
    async def start_run(
        self, event: EventRow, params: dict[str, Any] | None = None, *, actor: str = "cli"
    ) -> RunRow: ...

    @overload
    async def start_run(
        self, event: EventRow, params: dict[str, Any] | None = None, *, actor: str = "cli", schedule_key: str
    ) -> RunRow | None: ...

    async def start_run(
        self,
        event: EventRow,
        params: dict[str, Any] | None = None,
        *,
        actor: str = "cli",
        schedule_key: str | None = None,
    ) -> RunRow | None:
        """Create a run of `event` with `params`. Every step is rendered and validated now,
        so a run with a bad parameter is refused before anything runs.

        A `schedule_key` names one occurrence of the event's schedule, which makes at most
        one run: None means that occurrence's run exists already."""
        return await runs.start_run(
            self.store, self.registry, self.clock, event, params, actor=actor, schedule_key=schedule_key
        )

    async def cancel_run(self, run_id: int, *, actor: str = "cli") -> bool:
        """Stop new dispatches; in-flight steps answer; the run ends cancelled and is cleaned up."""
        return await self.store.request_cancel(run_id, actor, self.clock.now())

    async def _advance(self) -> tuple[bool, datetime | None]:
        """Move every run in flight on as far as it can go now, in one transaction.

        Answers whether anything moved, and the earliest time something will be due.
        Each move is guarded by the run's state as read here, so if two workers advance
        one run, only one move applies; the steps a losing move tried to insert are the
        same rows (the same keys), which the insert ignores.
        """
        due: datetime | None = None
        now = self.clock.now()
        moves: list[RunMove] = []
        in_flight = await self.store.runs_in_flight(known=self._definitions.keys())
        # Forget the runs that ended elsewhere (another worker finished them).
        alive = {c.run.id for c in in_flight}
        for run_id in [i for i in self._definitions if i not in alive]:
            del self._definitions[run_id]
        for counts in in_flight:
            run = counts.run
            frozen = self._frozen(run)
            if run.cancel_requested:
                if counts.ready or not counts.running:
                    status = RunStatus.FAILED if run.error else RunStatus.CANCELLED
                    moves.append(RunMove(run, skip_ready=bool(counts.ready), finish=None if counts.running else status))
                continue
            move = RunMove(run)
            phase, materialised = run.phase, run.materialised_phase
            if materialised < phase:
                assert run.phase_due_at is not None
                if run.phase_due_at > now:
                    due = _earliest(due, run.phase_due_at)
                    continue
                try:
                    move.steps = self._steps_of(run, frozen, phase)
                except RoadieError as exc:
                    moves.append(
                        RunMove(run, skip_ready=True, fail=f"phase {frozen.phases[phase].name}: {exc.message}")
                    )
                    continue
                materialised = phase
            elif not (counts.ready or counts.running):
                if phase + 1 < len(frozen.phases):
                    phase += 1
                    after = frozen.phases[phase].after
                    move.phase_due_at = now + timedelta(seconds=after)
                    if after <= 0:  # no delay: begin the next phase in the same move
                        try:
                            move.steps = self._steps_of(run, frozen, phase)
                            materialised = phase
                        except RoadieError:
                            pass  # the next pass, materialising on its own, fails the run
                else:
                    started = run.started_at or now
                    ends_at = run.ends_at or max(now, started + timedelta(seconds=frozen.event.duration))
                    if ends_at <= now:
                        move.finish = RunStatus.SUCCEEDED
                    elif run.ends_at is None:
                        move.ends_at = ends_at
                        due = _earliest(due, ends_at)
                    else:
                        due = _earliest(due, ends_at)
                        continue
            else:
                continue
            move.phase, move.materialised_phase = phase, materialised
            moves.append(move)
        if not moves:
            return False, due
        await self.store.advance_runs(moves, now)
        for move in moves:
            if move.steps and move.materialised_phase is not None:
                name = self._frozen(move.run).phases[move.materialised_phase].name
                self._tell("phase", {"run_id": move.run.id, "phase": move.materialised_phase, "name": name})
            if move.finish is not None:
                self._definitions.pop(move.run.id, None)
                self._tell("run", {"run_id": move.run.id, "status": move.finish.value})
        return True, due

    def _frozen(self, run: RunRow) -> FrozenDefinition:
        """A run's definition never changes after it is created, so it is parsed once."""
        frozen = self._definitions.get(run.id)
        if frozen is None:
            frozen = self._definitions[run.id] = FrozenDefinition.model_validate(run.definition)
        return frozen

    def _steps_of(self, run: RunRow, frozen: FrozenDefinition, index: int) -> list[NewStep]:
        """The rows materialise inserts for one phase of a run."""
        phase = frozen.phases[index]
        new_steps = []
        for step in phase.steps:
            action = self.registry.action(step.action)
            lease_ref = leases.lease_ref(self.registry, step.params) if action.borrows else None
            new_steps.append(
                NewStep(
                    phase=step.phase,
                    seq=step.seq,
                    name=step.name,
                    action=step.action,
                    owner=action.owner,
                    reversible=action.reversible,
                    lease_ref=lease_ref,
                    params=step.params,
                    # Minted once, here, and never changed by a retry (DESIGN §1).
                    idempotency_key=f"{run.nonce}-{run.id}-{step.phase}-{step.seq}",
                    max_attempts=step.retry.attempts,
                    retry=step.retry.model_dump(mode="json"),
                    timeout=step.timeout,
                    on_error=step.on_error.value,
                )
            )
        return new_steps

    # -- the drain ------------------------------------------------------------------

    async def _drain(self) -> bool:
        """Claim, dispatch and record until nothing is runnable now. Answers whether
        anything was dispatched.

        Claims refill the window in batches (when a quarter of it is free, or it is
        empty), and every answer that is in when the worker looks is recorded in one
        transaction: a database commit is the scarce thing, so each one carries as
        many steps as are ready.
        """
        inflight: dict[asyncio.Future[Any], Claimed] = {}
        heartbeat: asyncio.Task[None] | None = None
        worked = False
        refill = max(1, self.options.concurrency // 4)
        may_have_moved = True  # whether a run may have a phase to begin or an end to reach
        unrecorded: list[Outcome] = []  # answers whose recording failed, to be recorded again
        failures = 0
        try:
            while True:
                free = self.options.concurrency - len(inflight)
                claimed: list[Claimed] = []
                if free > 0 and (free >= refill or not inflight) and not self._stopping.is_set():
                    try:
                        claimed = await self.store.claim_steps(
                            self.worker_id,
                            self.clock.now(),
                            free,
                            self.options.claim_ttl,
                            token=mint_token(self.incarnation),
                        )
                    except StoreError as exc:
                        if not inflight and not unrecorded:
                            raise
                        # The dispatches in flight have written the world: their answers
                        # must still be recorded, so claiming more waits for the next pass.
                        log.warning("claiming steps failed; finishing those in flight", error=exc.message)
                        claimed = []
                    for c in claimed:
                        if c.refused:
                            self._tell(
                                "step",
                                {"run_id": c.step.run_id, "step": c.step.name, "status": "failed", "error": c.refused},
                            )
                            may_have_moved = True
                            continue
                        inflight[asyncio.create_task(self._dispatch(c))] = c
                        assert c.step.claim_token is not None
                        self._inflight_ids[c.step.id] = c.step.claim_token
                        worked = True
                    if len(claimed) < free and may_have_moved:
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
                if not inflight and not unrecorded:
                    if claimed:
                        continue
                    return worked
                if inflight:
                    if heartbeat is None or heartbeat.done():
                        heartbeat = asyncio.create_task(self.clock.sleep(self.options.claim_ttl / 3))
                    await asyncio.wait([*inflight, heartbeat], return_when=asyncio.FIRST_COMPLETED)
                    # Let dispatches that are about to finish do so, and take them all at once.
                    await asyncio.sleep(0)
                    if heartbeat.done() and self._heart is None:
                        # Without run_forever's background heartbeat (settle, tests), the
                        # drain beats for what it holds.
                        try:
                            await self.heartbeat()
                        except StoreError as exc:  # a claim outlives two missed beats
                            log.warning("heartbeat failed", worker=self.worker_id, error=exc.message)
                    if self._lost:
                        self._abandon_lost(inflight)
                finished = [t for t in inflight if t.done()]
                outcomes: list[Outcome] = [*unrecorded, *(t.result() for t in finished)]
                for t in finished:
                    self._inflight_ids.pop(inflight.pop(t).step.id, None)
                if outcomes:
                    try:
                        await self.store.record_outcomes(outcomes)
                    except StoreError as exc:
                        # The answers are in hand and the world has been written: keep them
                        # and record them again, rather than let their claims expire and
                        # the steps run a second time.
                        failures += 1
                        if failures >= RECORD_ATTEMPTS:
                            raise
                        log.warning("recording answers failed; trying again", error=exc.message, steps=len(outcomes))
                        unrecorded = outcomes
                        await asyncio.sleep(0.05 * failures)
                        continue
                    unrecorded, failures = [], 0
                    for o in outcomes:
                        if o.stale:
                            log.warning("claim lost; answer not recorded", run_id=o.step.run_id, step_id=o.step.id)
                            continue
                        self._tell_outcome(o)
                    if any(o.status is not StepStatus.READY for o in outcomes):
                        may_have_moved = True
        finally:
            for task in [*inflight, *([heartbeat] if heartbeat else [])]:
                task.cancel()
            for c in inflight.values():
                self._inflight_ids.pop(c.step.id, None)

    def _abandon_lost(self, inflight: dict[asyncio.Future[Any], Claimed]) -> None:
        """Stop the dispatches whose claims another worker has taken over: the step is
        theirs now, and running it here as well is what claims exist to prevent."""
        for task, c in list(inflight.items()):
            if c.step.id in self._lost:
                log.warning("claim lost; dispatch abandoned", run_id=c.step.run_id, step_id=c.step.id)
                task.cancel()
                del inflight[task]
                self._inflight_ids.pop(c.step.id, None)
        self._lost.clear()

    async def heartbeat(self) -> None:
        """Say this worker is alive and extend the claims of what it holds, in one write."""
        held = dict(self._inflight_ids)
        lost = await self.store.heartbeat_worker(
            self.worker_id, self.clock.now(), self.options.claim_ttl, steps_held=held
        )
        # Only the attempt the beat asked about: one that ended meanwhile, and was claimed
        # again by this worker, is a new claim (a new token) the beat did not see.
        self._lost |= {i for i in lost if self._inflight_ids.get(i) == held[i]}

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
        self._tell("step", {"run_id": step.run_id, "step": step.name, "status": "running", "attempt": step.attempts})
        try:
            action = self.registry.action(step.action)
            if action.borrows:
                assert claimed.reserved_id is not None
                outcome: Outcome = await self._with_timeout(
                    leases.borrow(self.store, self.registry, self.clock, step, claimed.reserved_id), step.timeout
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
            )
            raw = await self._with_timeout(action.call(call), step.timeout)
        except UnknownAction as exc:
            return self._failed(step, started, f"{exc.message}: its module is not loaded", retryable=False)
        except StepError as exc:
            return self._failed(
                step, started, exc.message or type(exc).__name__, retryable=exc.retryable, delay=exc.next_retry_delay
            )
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
        self, step: StepRow, started: datetime, error: str, *, retryable: bool, delay: float | None = None
    ) -> Outcome:
        now = self.clock.now()
        if retryable and step.attempts < step.max_attempts:
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

    # -- the worker loop ------------------------------------------------------------

    async def tick(self) -> datetime | None:
        """Do everything that is due now; answer when something will next be due."""
        now = self.clock.now()
        await self.store.requeue_expired_claims(now)
        await schedules.create_due_runs(self)
        await self._advance()
        await self._drain()
        if self._stopping.is_set():  # a stopping worker finishes what it holds, starts nothing
            return None
        await leases.sweep_expired(
            self.store, self.registry, self.clock, self.options.claim_ttl, incarnation=self.incarnation
        )
        for run_id in await self.store.runs_due_cleanup(self.clock.now()):
            if self._stopping.is_set() or len(self._cleanups) >= self.options.cleanups:
                break
            if run_id not in self._cleanups:
                self._cleanups[run_id] = asyncio.create_task(self._auto_cleanup(run_id))
        return await self._next_due()

    async def _auto_cleanup(self, run_id: int) -> None:
        """A cleanup the worker started by itself, as a task beside the drain: a module that
        is slow to revert holds up that cleanup, never the worker's steps."""
        try:
            await self.clean_up(run_id, actor="system")
        except InvalidState as exc:  # another owner took it first, or took it over: theirs
            log.info("cleanup skipped", run_id=run_id, reason=exc.message)
        except StoreError as exc:  # the database went away: the claim expires, and it is due again
            log.warning("cleanup failed", run_id=run_id, error=exc.message)
        finally:
            self._cleanups.pop(run_id, None)

    async def cleanups_done(self) -> None:
        """Wait for the automatic cleanups under way to end."""
        while self._cleanups:
            await asyncio.wait(list(self._cleanups.values()))

    async def clean_up(
        self, run_id: int, *, actor: str = "system", member_key: str | None = None, again: bool = False
    ) -> CleanupReport:
        self._tell("cleanup", {"run_id": run_id, "status": "started"})
        report = await self.cleanup.run(run_id, actor=actor, member_key=member_key, again=again)
        self._tell("cleanup", {"run_id": run_id, "status": report.status, "report": report.as_dict()})
        return report

    async def _next_due(self) -> datetime | None:
        _, due = await self._advance()
        for candidate in (
            await self.store.next_step_due(),
            await self.store.next_lease_expiry(),
            await self.store.next_claim_expiry(),
            await schedules.next_due(self),
        ):
            due = _earliest(due, candidate)
        return due

    async def run_forever(self) -> None:
        """The worker: tick, then sleep until the next thing is due (or a poll interval).

        It registers itself, heartbeats in the background while it lives (busy or idle),
        and when stopped deregisters, giving back whatever it still holds.
        """
        await self.store.register_worker(
            self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            concurrency=self.options.concurrency,
            version=_version(),
            now=self.clock.now(),
        )
        self._heart = asyncio.create_task(self._beat_forever())
        log.info("worker started", worker=self.worker_id)
        try:
            await self._work_forever()
            await self.cleanups_done()
        finally:
            for task in self._cleanups.values():
                task.cancel()
            self._heart.cancel()
            self._heart = None
            released = await self.store.deregister_worker(self.worker_id, self.incarnation, self.clock.now())
            log.info("worker stopped", worker=self.worker_id, released_steps=released[0], released_cleanups=released[1])

    async def _work_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                due = await self.tick()
            except StoreError as exc:
                # The database went away for a moment (locked, restarting): nothing is
                # lost, because nothing is kept outside it. Look again shortly.
                log.warning("tick failed; retrying", error=exc.message)
                due = None
            wait = self.options.poll_interval
            if due is not None:
                wait = max(0.0, min(wait, (due - self.clock.now()).total_seconds()))
            sleeper = asyncio.create_task(self.clock.sleep(wait))
            stopper = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([sleeper, stopper], return_when=asyncio.FIRST_COMPLETED)
            sleeper.cancel()
            stopper.cancel()

    def stop(self) -> None:
        """Stop claiming; `run_forever` returns once in-flight steps have answered."""
        self._stopping.set()

    async def settle(self, run_ids: Iterable[int], *, max_ticks: int = 100_000) -> list[RunRow]:
        """Work until these runs have ended and any automatic cleanup is done.

        With a `FakeClock` time jumps straight to the next due moment; with the system
        clock this sleeps until then, as a worker would.
        """
        ids = list(run_ids)
        for _ in range(max_ticks):
            due = await self.tick()
            await self.cleanups_done()
            current = await self.store.runs_by_ids(ids)
            if all(_settled(r) for r in current):
                return current
            if due is None:
                due = self.clock.now() + timedelta(seconds=self.options.poll_interval)
            if isinstance(self.clock, FakeClock):
                self.clock.set(max(due, self.clock.now()))
            else:
                await self.clock.sleep(max(0.0, (due - self.clock.now()).total_seconds()))
        raise RoadieError(f"runs {ids} did not settle within {max_ticks} ticks")

    def _tell(self, kind: str, data: dict[str, Any]) -> None:
        try:
            self.observer(kind, data)
        except Exception:  # an observer (a progress display) must never break the engine
            log.exception("observer failed")

    def _tell_outcome(self, o: Outcome) -> None:
        status = {StepStatus.READY: "retry"}.get(o.status, o.status.value)
        self._tell(
            "step",
            {
                "run_id": o.step.run_id,
                "step": o.step.name,
                "phase": o.step.phase,
                "status": status,
                "error": o.error,
                "rejections": o.rejections,
                "recorded": o.recorded,
            },
        )


def _version() -> str:
    try:
        return metadata.version("roadie")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _settled(run: RunRow) -> bool:
    if not RunStatus(run.status).terminal:
        return False
    awaiting_cleanup = run.cleanup_status == CleanupStatus.PENDING.value
    return not (run.cleanup_policy == CleanupPolicy.AUTO.value and awaiting_cleanup)


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)

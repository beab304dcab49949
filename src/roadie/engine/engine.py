"""The run engine: one worker, and its loop — tick (requeue, schedules, advance, drain,
sweep, start cleanups), then sleep until something is due.

One `Engine` is one worker. Everything it knows between two moments is in the database,
so an engine abandoned at any point (a crash) is replaced by a fresh one on the same
files, which carries on: claims of the dead worker expire and their steps are retried
under the same idempotency keys. Its parts live beside it: `advance.py` moves runs on,
`drain.py` claims, dispatches and records their steps, `cleanup.py` takes them down.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from importlib import metadata
from typing import Any, overload

from roadie.clock import Clock, FakeClock, SystemClock
from roadie.definitions import FrozenDefinition
from roadie.engine import leases, runs, schedules
from roadie.engine.base import EngineOptions, Observer, earliest
from roadie.engine.cleanup import Cleanup, CleanupReport
from roadie.engine.drain import Drain
from roadie.engine.keep import ANNOUNCE_LOOK, Keeper
from roadie.engine.notify import Notifier, Webhook
from roadie.engine.sweep import Sweeper
from roadie.errors import (
    DatabaseLost,
    HandedBack,
    InvalidState,
    RoadieError,
    StoreError,
)
from roadie.log import get_logger
from roadie.registry import Registry
from roadie.states import RunStatus, awaits_auto_cleanup
from roadie.store import Store
from roadie.store.rows import EventRow, RunRow

log = get_logger(__name__)


class Engine(Drain):
    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        clock: Clock | None = None,
        worker_id: str | None = None,
        options: EngineOptions | None = None,
        observer: Observer | None = None,
        webhooks: Sequence[Webhook] = (),
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
            store,
            registry,
            self.clock,
            self.worker_id,
            self.options.claim_ttl * 5,
            incarnation=self.incarnation,
            cap=self.options.cleanup_cap,
            caps=self.options.cleanup_caps,
            stopping=lambda: self._stopping.is_set(),
        )
        self.observer: Observer = observer or (lambda kind, data: None)
        self._stopping = asyncio.Event()
        self._definitions: dict[int, FrozenDefinition] = {}  # runs in flight, parsed once
        # Whether this engine drains the runs it creates, and so keeps their definitions as
        # it makes them (`_definitions`, emptied as its advance sees them end). An engine
        # that only creates runs (the web app without its worker) would keep them for ever.
        self.keeps_definitions = True
        # What the heartbeat keeps claimed: the steps in flight and the cleanups under way.
        self._inflight_ids: dict[int, str] = {}  # step id -> the claim token of the attempt in flight
        self._claim_expiry: dict[str, datetime] = {}  # claim token -> when it runs out, unless a beat renews it
        self._cleanups: dict[int, asyncio.Task[None]] = {}  # automatic cleanups under way, by run
        self._lost: set[int] = set()  # steps the heartbeat found taken over by another worker
        self._heart: asyncio.Task[None] | None = None  # run_forever's background heartbeat
        self.notifier = Notifier(store, list(webhooks), self.clock, incarnation=self.incarnation) if webhooks else None
        self._sending: asyncio.Task[None] | None = None  # notifications being sent, beside the drain
        self.sweeper = Sweeper(store, registry, self.clock, call_timeout=self.cleanup.call_timeout)
        self._sweeping: asyncio.Task[None] | None = None  # the periodic orphan sweep, beside the drain
        self._next_sweep: datetime | None = None
        self._sweep_jitter = random.Random(self.options.seed)  # its own: the engine's stream stays as it was
        self.keeper = Keeper(
            store, registry, self.clock, claim_ttl=self.options.claim_ttl, incarnation=self.incarnation
        )
        self._keeping: asyncio.Task[None] | None = None  # the look at running runs' setups, beside the drain
        self._next_keep: datetime | None = None
        self._next_announce_look = self.clock.now()

    # -- runs -----------------------------------------------------------------------

    @overload
    async def start_run(
        self, event: EventRow, params: dict[str, Any] | None = None, *, actor: str = "cli", force: bool = False
    ) -> RunRow: ...

    @overload
    async def start_run(
        self,
        event: EventRow,
        params: dict[str, Any] | None = None,
        *,
        actor: str = "cli",
        schedule_key: str,
        force: bool = False,
    ) -> RunRow | None: ...

    async def start_run(
        self,
        event: EventRow,
        params: dict[str, Any] | None = None,
        *,
        actor: str = "cli",
        schedule_key: str | None = None,
        force: bool = False,
    ) -> RunRow | None:
        """Create a run of `event` with `params`. Every step is rendered and validated now,
        so a run with a bad parameter is refused before anything runs; so is one that
        would borrow a setting another run holds or call a module that is offline
        (`PreflightRefused`, naming it),
        unless `force`, which starts it anyway and audits the override (`run.force`).

        A `schedule_key` names one occurrence of the event's schedule, which makes at most
        one run: None means that occurrence's run exists already."""
        keys = [schedule_key] if schedule_key is not None else None
        [run] = await self._start(event, [params], actor, keys, force)
        return run

    async def start_runs(
        self, event: EventRow, params: Sequence[dict[str, Any] | None], *, actor: str = "cli", force: bool = False
    ) -> list[RunRow]:
        """Create a run of `event` for each of `params`, all in one transaction, each
        rendered, validated and pre-flighted first: one bad parameter, or one setting
        another run holds, refuses them all (unless `force`)."""
        made = await self._start(event, params, actor, None, force)
        return [run for run in made if run is not None]  # (only an occurrence's run can be None)

    async def _start(
        self,
        event: EventRow,
        params: Sequence[dict[str, Any] | None],
        actor: str,
        keys: list[str] | None,
        force: bool,
    ) -> list[RunRow | None]:
        return await runs.start_runs(
            self.store,
            self.registry,
            self.clock,
            event,
            params,
            actor=actor,
            schedule_keys=keys,
            in_thread=self.options.render_in_thread,
            definitions=self._definitions if self.keeps_definitions else None,
            force=force,
        )

    async def cancel_run(self, run_id: int, *, actor: str = "cli") -> bool:
        """Stop new dispatches; in-flight steps answer; the run ends cancelled and is cleaned up."""
        return await self.store.request_cancel(run_id, actor, self.clock.now())

    # -- the worker loop ------------------------------------------------------------

    async def tick(self) -> datetime | None:
        """Do everything that is due now; answer when something will next be due."""
        now = self.clock.now()
        if self.notifier is not None:
            await self.notifier.register()
        await self.store.requeue_expired_claims(now)
        await schedules.create_due_runs(self)
        await self._advance()
        await self._drain()
        if self._stopping.is_set():  # a stopping worker finishes what it holds, starts nothing
            return None
        await leases.sweep_expired(
            self.store, self.registry, self.clock, self.options.claim_ttl, incarnation=self.incarnation
        )
        await self._start_due_cleanups()
        if self.notifier is not None and (self._sending is None or self._sending.done()):
            self._sending = asyncio.create_task(self._send_notifications(self.notifier))
        self._start_sweep()
        await self._start_keep()
        return await self._next_due()

    async def catch_up(self) -> None:
        """Take down what fell due while no worker was alive, before starting anything new:
        leases past their `until` are given back, runs past their end are ended, and every
        cleanup that is due is done (awaited), each report saying how late it came. Only
        then does the worker create scheduled runs and dispatch steps."""
        try:
            await self.store.requeue_expired_claims(self.clock.now())
            await leases.sweep_expired(
                self.store, self.registry, self.clock, self.options.claim_ttl, incarnation=self.incarnation
            )
            await self._advance()
            await self._start_due_cleanups(wait=True)
            await self.cleanups_done()
        except StoreError as exc:  # the loop's first tick tries again
            log.warning("catching up failed", error=exc.message)

    async def _start_due_cleanups(self, *, wait: bool = False) -> None:
        """Start the due cleanups as tasks, up to `cleanups` at once: the rest are left for
        the next tick, or, with `wait`, started as room is made."""
        for run_id in await self.store.runs_due_cleanup(self.clock.now()):
            if self._stopping.is_set():
                return
            if len(self._cleanups) >= self.options.cleanups:
                if not wait:
                    return
                await self.cleanups_done()
            if run_id not in self._cleanups:
                self._cleanups[run_id] = asyncio.create_task(self._auto_cleanup(run_id))

    def _start_sweep(self) -> None:
        """The periodic orphan sweep, as a task beside the drain, every `sweep_interval`
        (jittered, so that many workers do not sweep together)."""
        interval = self.options.sweep_interval
        if not interval or not self.sweeper.listing():  # None or 0: only `roadie sweep` sweeps
            return
        now = self.clock.now()
        if self._next_sweep is None:
            self._next_sweep = now + timedelta(seconds=interval * self._sweep_jitter.uniform(0.5, 1.0))
        if now < self._next_sweep or (self._sweeping is not None and not self._sweeping.done()):
            return
        self._next_sweep = now + timedelta(seconds=interval * self._sweep_jitter.uniform(0.9, 1.1))
        self._sweeping = asyncio.create_task(self._sweep())

    async def _start_keep(self) -> None:
        """Look at running runs' setups, as a task beside the drain, every `keep_interval`,
        or at once when a pulling module has announced itself since the last look."""
        interval = self.options.keep_interval
        if not interval or (self._keeping is not None and not self._keeping.done()):
            return
        now = self.clock.now()
        lost_due = self.keeper.next_due()
        due = self._next_keep is None or now >= self._next_keep or (lost_due is not None and now >= lost_due)
        if not due and self.keeper.seen_until is not None and now >= self._next_announce_look:
            # A restarted module is looked at within seconds, not at the next full look;
            # asking costs a read, so not at every tick.
            self._next_announce_look = now + timedelta(seconds=min(interval, ANNOUNCE_LOOK))
            due = bool(await self.store.announced_since(self.keeper.seen_until))
        if not due:
            return
        self._next_keep = now + timedelta(seconds=interval)
        self._keeping = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        try:
            await self.keeper.keep()
        except StoreError as exc:
            log.warning("keeping running runs' setups failed", error=exc.message)
        except Exception:
            log.exception("keeping running runs' setups crashed")

    async def keeping_done(self) -> None:
        """Wait for the look at running runs' setups under way, if any, to end."""
        if self._keeping is not None:
            await asyncio.wait([self._keeping])

    async def sweeps_done(self) -> None:
        """Wait for the periodic sweep under way, if any, to end."""
        if self._sweeping is not None:
            await asyncio.wait([self._sweeping])

    async def _sweep(self) -> None:
        try:
            await self.sweeper.sweep(actor="system")
        except StoreError as exc:
            log.warning("orphan sweep failed", error=exc.message)
        except Exception:
            log.exception("orphan sweep crashed")

    async def _send_notifications(self, notifier: Notifier) -> None:
        """Webhooks, as a task beside the drain: a slow receiver holds up no step."""
        try:
            await notifier.deliver_due()
        except StoreError as exc:  # the claims run out, and the deliveries are due again
            log.warning("sending notifications failed", error=exc.message)
        except Exception:
            log.exception("sending notifications crashed")

    async def _auto_cleanup(self, run_id: int) -> None:
        """A cleanup the worker started by itself, as a task beside the drain: a module that
        is slow to revert holds up that cleanup, never the worker's steps."""
        try:
            await self.clean_up(run_id, actor="system")
        except InvalidState as exc:  # another owner took it first, or took it over: theirs
            log.info("cleanup skipped", run_id=run_id, reason=exc.message)
        except HandedBack as exc:  # the worker is stopping: another takes it from here
            log.info("cleanup handed back", run_id=run_id, reason=exc.message)
        except StoreError as exc:  # the database went away: the claim expires, and it is due again
            log.warning("cleanup failed", run_id=run_id, error=exc.message)
        except Exception:  # a task's error would go unseen: say it, and let the claim expire
            log.exception("cleanup crashed", run_id=run_id)
        finally:
            self._cleanups.pop(run_id, None)

    async def cleanups_done(self) -> None:
        """Wait for the automatic cleanups under way to end."""
        while self._cleanups:
            await asyncio.wait(list(self._cleanups.values()))

    async def notifications_sent(self) -> None:
        """Wait for the webhook sends under way to end (each send has its deadline)."""
        if self._sending is not None:
            await self._sending

    async def close(self) -> None:
        """Stop the automatic cleanups, the webhook sends, the sweep, the look at running
        runs' setups and the heartbeat under way (their claims expire, and another worker
        takes them over), so that none touches the store after its owner closes it."""
        tasks = list(self._cleanups.values())
        tasks += [t for t in (self._sending, self._sweeping, self._keeping, self._heart) if t is not None]
        tasks = [t for t in tasks if not t.done()]  # (one ended may be of a loop since closed)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.notifier is not None:
            await self.notifier.close()

    async def clean_up(
        self,
        run_id: int,
        *,
        actor: str = "system",
        member_key: str | None = None,
        again: bool = False,
        confirm: bool = False,
    ) -> CleanupReport:
        self._tell("cleanup", {"run_id": run_id, "status": "started"})
        report = await self.cleanup.run(run_id, actor=actor, member_key=member_key, again=again, confirm=confirm)
        self._tell("cleanup", {"run_id": run_id, "status": report.status, "report": report.as_dict()})
        return report

    async def _next_due(self) -> datetime | None:
        _, due = await self._advance()
        return earliest(earliest(due, await self.store.next_due()), await schedules.next_due(self))

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
            await self.catch_up()
            await self._work_forever()
            await self.cleanups_done()
            await self.notifications_sent()
        finally:
            await self.close()  # the heartbeat too: a beat under way ends before the store closes
            self._heart = None
            released = await self.store.deregister_worker(self.worker_id, self.incarnation, self.clock.now())
            log.info("worker stopped", worker=self.worker_id, released_steps=released[0], released_cleanups=released[1])

    async def _work_forever(self) -> None:
        failing = False
        while not self._stopping.is_set():
            lost = self.store.file_lost()
            if lost is not None:
                log.error("database lost; stopping", reason=lost)
                raise DatabaseLost(f"{lost} while this worker ran: it stopped, as its work would be lost")
            try:
                due = await self.tick()
                failing = False
            except StoreError as exc:
                # The database went away for a moment (locked, restarting): nothing is
                # lost, because nothing is kept outside it. Look again shortly; said once
                # for as long as it lasts.
                (log.debug if failing else log.warning)("tick failed; retrying", error=exc.message)
                failing = True
                due = None
            wait = self.options.poll_interval
            if due is not None:
                wait = max(0.0, min(wait, (due - self.clock.now()).total_seconds()))
            await self._nap(wait)

    async def _nap(self, seconds: float) -> None:
        """Sleep until then, or until `stop` is called."""
        sleeper = asyncio.create_task(self.clock.sleep(seconds))
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
        clock this sleeps until then, or `poll_interval` at most, as a worker would. Once `stop` is called it returns
        as soon as what was in flight has answered, with the runs as they then stand:
        whatever is left is any worker's to carry on.
        """
        ids = list(run_ids)
        for _ in range(max_ticks):
            due = await self.tick()
            await self.cleanups_done()
            # Their states only: a run's frozen definition grows with its steps, and
            # decoding it at every tick would cost more than the tick.
            current = await self.store.runs_by_ids(ids, definition=False)
            if all(settled(r) for r in current) or self._stopping.is_set():
                return await self.store.runs_by_ids(ids)
            if due is None:
                due = self.clock.now() + timedelta(seconds=self.options.poll_interval)
            if isinstance(self.clock, FakeClock):
                self.clock.set(max(due, self.clock.now()))
            else:
                # As a worker does, look again every poll_interval at most: a step whose call
                # is in another process's hands (a pulled call) may answer before it is due.
                wait = min(self.options.poll_interval, (due - self.clock.now()).total_seconds())
                await self._nap(max(0.0, wait))
        raise RoadieError(f"runs {ids} did not settle within {max_ticks} ticks")


def _version() -> str:
    try:
        return metadata.version("roadie")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def settled(run: RunRow) -> bool:
    """Ended, and cleaned up if its cleanup is automatic: nothing more happens to it unless
    someone asks."""
    if not RunStatus(run.status).terminal:
        return False
    return not awaits_auto_cleanup(run.cleanup_policy, run.cleanup_status, run.cleanup_attempts)

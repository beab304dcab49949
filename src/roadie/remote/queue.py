"""The pull transport: calls for a polling module go on the work queue in the database, and
the caller waits for the answer the module posts back through the gateway.

The queue is the database's, so workers and gateways may be separate processes on separate
machines. One `WorkQueue` per process collects the answers its callers wait for with one
query per tick; a gateway in the same process wakes it (and its long polls) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any

from roadie.clock import Clock, SystemClock
from roadie.errors import StepTimeout
from roadie.log import get_logger
from roadie.remote import protocol
from roadie.store.queue import AnswerTaken, QueuedCall, QueueStore
from roadie.store.store import Store

log = get_logger(__name__)


class WorkQueue:
    """Puts calls on the queue, hands them to pollers, and brings their answers back.

    A caller waits at most `deadline` seconds of `clock` (DESIGN §11): then its call is
    withdrawn and it gets a retryable `StepTimeout`, so a module that went offline holds
    no worker for ever.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        visibility: float = 30.0,
        poll_interval: float = 0.05,
        max_age: float = 3600.0,
        deadline: float = 60.0,
    ) -> None:
        self.calls = QueueStore(store)
        self.clock = clock or SystemClock()
        self.deadline = deadline
        self.visibility = visibility
        self.poll_interval = poll_interval
        self.max_age = max_age
        self._waiting: dict[int, list[asyncio.Future[tuple[int, Any]]]] = defaultdict(list)
        self._answered = asyncio.Event()  # an answer came in through this process's gateway
        self._work: dict[str, asyncio.Event] = defaultdict(asyncio.Event)  # new work, per module
        self._collector: asyncio.Task[None] | None = None
        self._last_expiry = 0.0
        self._closed = False  # the process is stopping: polls are answered at once, empty

    # -- the caller's side ----------------------------------------------------------

    async def submit(
        self,
        module: str,
        kind: protocol.CallKind,
        key: str,
        body: dict[str, Any],
        *,
        deadline: float | None = None,
    ) -> tuple[int, Any]:
        """Queue a call (or find the same call queued already) and wait for its answer, at
        most `deadline` seconds of the clock (the queue's own by default).

        When the deadline passes, or the caller is cancelled (its step's timeout, its
        cleanup ended), the call is withdrawn: never handed out again, its late answer not
        kept. A retry under the same key queues it afresh; an answer kept before the
        withdrawal stays, for that retry to find. Past the deadline: `StepTimeout`.
        """
        limit = self.deadline if deadline is None else deadline
        ended = f"its caller ended waiting ({kind} {key})"
        queued = asyncio.ensure_future(self.calls.enqueue(module, kind, key, body, self.clock.now()))
        try:
            call_id = await asyncio.shield(queued)
        except asyncio.CancelledError:
            # Cancelled while the call was being queued: it may be queued all the same.
            await _shielded(self._withdraw_when_queued(queued, ended))
            raise
        self._work[module].set()
        future: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[call_id].append(future)
        self._ensure_collector()
        try:
            async with self.clock.timeout(limit):
                return await future
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if self._forget(call_id, future):
                await _shielded(self._withdraw(call_id, ended))
            raise
        finally:
            self._forget(call_id, future)
        # The deadline passed. Another caller of this process may still want the call.
        reason = f"no answer within {limit:g}s"
        if not self._waiting.get(call_id) and not await self._withdraw(call_id, reason):
            # Answered just before the withdrawal: that answer is good, take it.
            found = await self.calls.answers([call_id])
            if call_id in found:
                await self._consume([call_id])
                return found[call_id]
        raise StepTimeout(f"{module} {kind}: {reason}; the call is withdrawn from the queue")

    def _forget(self, call_id: int, future: asyncio.Future[tuple[int, Any]]) -> bool:
        """Stop waiting with `future`; True when no caller of this process waits for the call."""
        waiters = self._waiting.get(call_id)
        if waiters is not None and future in waiters:
            waiters.remove(future)
            if not waiters:
                del self._waiting[call_id]
        return not self._waiting.get(call_id)

    async def _withdraw(self, call_id: int, reason: str) -> bool:
        withdrawn = await self.calls.withdraw(call_id, self.clock.now(), reason)
        if withdrawn:
            log.info("queued call withdrawn", call=call_id, reason=reason)
        return withdrawn

    async def _withdraw_when_queued(self, queued: asyncio.Future[int], reason: str) -> None:
        await self._withdraw(await queued, reason)

    async def _consume(self, call_ids: list[int]) -> None:
        try:
            await self.calls.consume(call_ids)
        except Exception as exc:  # consumed or not, each caller has its answer
            log.warning("consuming answers failed", error=str(exc))

    def _ensure_collector(self) -> None:
        if self._collector is None or self._collector.done():
            self._collector = asyncio.get_running_loop().create_task(self._collect())

    async def _collect(self) -> None:
        """Bring answers to their callers; stops when nobody is waiting."""
        while self._waiting:
            try:
                found = await self.calls.answers(list(self._waiting))
            except Exception as exc:  # the next tick may get through
                log.warning("reading answers failed", error=str(exc))
                found = {}
            for call_id, answer in found.items():
                for future in self._waiting.pop(call_id, []):
                    if not future.done():
                        future.set_result(answer)
            if found:
                await self._consume(list(found))
            if not self._waiting:
                break
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), self.poll_interval)

    # -- the gateway's side ---------------------------------------------------------

    async def take(
        self, module: str, limit: int, wait: float, *, gone: asyncio.Event | None = None
    ) -> list[QueuedCall]:
        """Hand out due calls, holding the poll open up to `wait` seconds when there are none,
        and handing out nothing once `gone` is set (the poller hung up)."""
        deadline = asyncio.get_running_loop().time() + wait
        await self._expire()
        while True:
            if self._closed or (gone is not None and gone.is_set()):
                return []  # nothing handed out by a process going away, or to nobody
            event = self._work[module]
            event.clear()
            taken = await self.calls.take(module, limit, self.clock.now(), self.visibility)
            remaining = deadline - asyncio.get_running_loop().time()
            if taken or remaining <= 0:
                return taken
            # Woken at once by a call queued in this process, or by `gone`; other
            # processes' calls are seen at the next look.
            woken = [asyncio.ensure_future(event.wait())]
            if gone is not None:
                woken.append(asyncio.ensure_future(gone.wait()))
            try:
                await asyncio.wait(woken, timeout=min(remaining, max(self.poll_interval * 4, 0.2)))
            finally:
                for waiter in woken:
                    waiter.cancel()

    def close(self) -> None:
        """The process is stopping: every poll held open is answered now, with nothing, and
        so is every poll after it, so a web server stopping need not wait out each poll's
        `wait` (the module polls again, and is served by another process or this one when
        it is back). Calls already handed out are answered through any gateway."""
        self._closed = True
        for event in self._work.values():
            event.set()

    async def answer(self, module: str, call_id: int, status: int, body: Any, token: str | None = None) -> AnswerTaken:
        """Keep an answer the module posted for the delivery `token` names (see
        `QueueStore.answer`); a refused one says why, and no caller ever sees it."""
        taken = await self.calls.answer(module, call_id, status, body, self.clock.now(), token)
        if taken:
            self._answered.set()
        else:
            log.info("answer refused", module=module, call=call_id, reason=taken.reason)
        return taken

    async def _expire(self) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._last_expiry < 60:
            return
        self._last_expiry = now
        dropped = await self.calls.expire(self.clock.now() - timedelta(seconds=self.max_age))
        if dropped:
            log.info("expired calls dropped from the work queue", calls=dropped)

    def now(self) -> datetime:
        return self.clock.now()


class PullTransport:
    """A module that polls: every call goes through the work queue."""

    mode = "pull"

    def __init__(self, name: str, queue: WorkQueue | Callable[[], WorkQueue], *, deadline: float | None = None) -> None:
        self.name = name
        self._queue = queue
        self.deadline = deadline  # None: the queue's own

    @property
    def queue(self) -> WorkQueue:
        return self._queue if isinstance(self._queue, WorkQueue) else self._queue()

    async def call(self, kind: protocol.CallKind, body: dict[str, Any], key: str) -> tuple[int, Any]:
        return await self.queue.submit(self.name, kind, key, body, deadline=self.deadline)

    async def close(self) -> None:
        return None


async def _shielded(work: Coroutine[Any, Any, Any]) -> None:
    """Run `work` to its end although the caller is being cancelled: a withdrawal cut
    short would leave the call deliverable with nobody waiting for it."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        pass  # cancelled again: the task still runs; the first cancellation is re-raised
    except Exception as exc:  # the expiry drops it in the end
        log.warning("withdrawing a call failed", error=str(exc))

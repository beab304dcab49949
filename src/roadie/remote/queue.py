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
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog

from roadie.clock import Clock, SystemClock
from roadie.remote import protocol
from roadie.store.queue import QueuedCall, QueueStore
from roadie.store.store import Store

log = structlog.get_logger(__name__)


class WorkQueue:
    """Puts calls on the queue, hands them to pollers, and brings their answers back."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        visibility: float = 30.0,
        poll_interval: float = 0.05,
        max_age: float = 3600.0,
    ) -> None:
        self.calls = QueueStore(store)
        self.clock = clock or SystemClock()
        self.visibility = visibility
        self.poll_interval = poll_interval
        self.max_age = max_age
        self._waiting: dict[int, list[asyncio.Future[tuple[int, Any]]]] = defaultdict(list)
        self._answered = asyncio.Event()  # an answer came in through this process's gateway
        self._work: dict[str, asyncio.Event] = defaultdict(asyncio.Event)  # new work, per module
        self._collector: asyncio.Task[None] | None = None
        self._last_expiry = 0.0

    # -- the caller's side ----------------------------------------------------------

    async def submit(self, module: str, kind: protocol.CallKind, key: str, body: dict[str, Any]) -> tuple[int, Any]:
        """Queue a call (or find the same call queued already) and wait for its answer.

        Cancelled (the step's timeout), the call stays queued: the step's retry finds it,
        and its answer too if the module answered in the meantime.
        """
        call_id = await self.calls.enqueue(module, kind, key, body, self.clock.now())
        self._work[module].set()
        future: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[call_id].append(future)
        self._ensure_collector()
        try:
            return await future
        finally:
            waiters = self._waiting.get(call_id)
            if waiters is not None and future in waiters:
                waiters.remove(future)
                if not waiters:
                    del self._waiting[call_id]

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
                try:
                    await self.calls.consume(list(found))
                except Exception as exc:  # consumed or not, each caller has its answer
                    log.warning("consuming answers failed", error=str(exc))
            if not self._waiting:
                break
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), self.poll_interval)

    # -- the gateway's side ---------------------------------------------------------

    async def take(self, module: str, limit: int, wait: float) -> list[QueuedCall]:
        """Hand out due calls, holding the poll open up to `wait` seconds when there are none."""
        deadline = asyncio.get_running_loop().time() + wait
        await self._expire()
        while True:
            event = self._work[module]
            event.clear()
            taken = await self.calls.take(module, limit, self.clock.now(), self.visibility)
            remaining = deadline - asyncio.get_running_loop().time()
            if taken or remaining <= 0:
                return taken
            # Woken at once by a call queued in this process; other processes' calls are
            # seen at the next look.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(remaining, max(self.poll_interval * 4, 0.2)))

    async def answer(self, module: str, call_id: int, status: int, body: Any) -> bool:
        accepted = await self.calls.answer(module, call_id, status, body, self.clock.now())
        self._answered.set()
        return accepted

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

    def __init__(self, name: str, queue: WorkQueue | Callable[[], WorkQueue]) -> None:
        self.name = name
        self._queue = queue

    @property
    def queue(self) -> WorkQueue:
        return self._queue if isinstance(self._queue, WorkQueue) else self._queue()

    async def call(self, kind: protocol.CallKind, body: dict[str, Any], key: str) -> tuple[int, Any]:
        return await self.queue.submit(self.name, kind, key, body)

    async def close(self) -> None:
        return None

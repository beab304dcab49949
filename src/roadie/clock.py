"""The one clock every delay, backoff, duration and expiry reads (DESIGN §9).

Tests hand the engine a `FakeClock` and move time forward instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait for `seconds` of this clock's time."""
        ...

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        """An `async with` block that raises TimeoutError after `seconds` of this clock's time."""
        ...


class SystemClock:
    """Wall-clock time and asyncio's sleep."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(seconds)


class FakeClock:
    """A clock that only moves when told to.

    `advance()` and `set()` move time and wake every sleeper whose deadline has passed.
    Nothing moves it by itself: a test says when time passes, so the order of events
    never depends on how fast the machine is.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()
        self._timeouts: list[tuple[datetime, int, _FakeTimeout]] = []

    def now(self) -> datetime:
        return self._now

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        return _FakeTimeout(self, self._now + timedelta(seconds=seconds))

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + timedelta(seconds=seconds), next(self._counter), future))
        await future

    def advance(self, seconds: float) -> None:
        self.set(self._now + timedelta(seconds=seconds))

    def set(self, when: datetime) -> None:
        if when > self._now:
            self._now = when
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        while self._timeouts and self._timeouts[0][0] <= self._now:
            _, _, block = heapq.heappop(self._timeouts)
            block.expire()

    def next_deadline(self) -> datetime | None:
        """When the earliest sleeper wakes or timeout expires, if any is waiting."""
        waiting = [s[0] for s in self._sleepers if not s[2].done()]
        waiting += [t[0] for t in self._timeouts if t[2].active]
        return min(waiting) if waiting else None


class _FakeTimeout:
    """`asyncio.timeout` with no deadline of its own, given one on the loop's clock the
    moment the fake clock passes its deadline."""

    def __init__(self, clock: FakeClock, deadline: datetime) -> None:
        self.clock = clock
        self.deadline = deadline
        self.active = False
        self._block = asyncio.timeout(None)

    async def __aenter__(self) -> object:
        await self._block.__aenter__()
        self.active = True
        heapq.heappush(self.clock._timeouts, (self.deadline, next(self.clock._counter), self))
        if self.deadline <= self.clock.now():
            self.expire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.active = False
        self.clock._timeouts = [t for t in self.clock._timeouts if t[2] is not self]
        heapq.heapify(self.clock._timeouts)
        await self._block.__aexit__(*exc)

    def expire(self) -> None:
        if self.active:
            self.active = False
            self._block.reschedule(asyncio.get_running_loop().time())

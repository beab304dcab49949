"""The one clock every delay, backoff, duration and expiry reads (DESIGN §9).

Tests hand the engine a `FakeClock` and move time forward instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait for `seconds` of this clock's time."""
        ...


class SystemClock:
    """Wall-clock time and asyncio's sleep."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


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

    def now(self) -> datetime:
        return self._now

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

    def next_deadline(self) -> datetime | None:
        """When the earliest sleeper wakes, if any is waiting."""
        live = [s for s in self._sleepers if not s[2].done()]
        return min(live)[0] if live else None

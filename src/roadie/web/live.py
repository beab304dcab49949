"""Live updates, as server-sent events.

A run's stream reads the run from the database, so it follows a run whichever worker
(this process's or another machine's) carries it out. The embedded worker's observer
wakes it early; without one it looks once a `poll` interval. It sends an event `run`
whenever what the run shows changes, and `end` once the run has ended and any automatic
cleanup is done, then closes.

A list's stream (the runs, a run's ledger, the leases, the workers: `watch_events`) reads
what its page shows the same way. It sends `watching` once it has first read it, and
`change` whenever that differs from what it last read; the page then fetches itself again
and swaps in its table. A page is drawn before its stream opens, so at `watching` it looks
again once: what changed between the two is then not missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from roadie.engine.engine import settled
from roadie.errors import StoreError
from roadie.store import Store
from roadie.store.rows import RunRow, StepRow

log = logging.getLogger(__name__)
KEEPALIVE = 15.0  # seconds between comment lines, so proxies keep an idle stream open
ANY_RUN = -1  # what `Broker.wait` is given to wake on any run's news


class Broker:
    """Wakes the streams of a run when the engine says something happened to it."""

    def __init__(self) -> None:
        self._waiting: dict[int, set[asyncio.Event]] = defaultdict(set)

    def observe(self, kind: str, data: dict[str, Any]) -> None:
        for key in (int(data.get("run_id", 0)), ANY_RUN):
            for event in self._waiting.get(key, ()):
                event.set()

    async def wait(self, run_id: int, seconds: float) -> None:
        event = asyncio.Event()
        self._waiting[run_id].add(event)
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            pass
        finally:
            self._waiting[run_id].discard(event)
            if not self._waiting[run_id]:
                del self._waiting[run_id]


def summary(run: RunRow, steps: list[StepRow]) -> dict[str, Any]:
    """What a viewer of the run sees change: its states and each step's status and attempts."""
    return {
        "run_id": run.id,
        "status": run.status,
        "cleanup_status": run.cleanup_status,
        "phase": run.phase,
        "cancel_requested": run.cancel_requested,
        "steps": {str(s.id): [s.status, s.attempts] for s in steps},
        "cleanup_ended_at": run.cleanup_ended_at.isoformat() if run.cleanup_ended_at else None,
    }


def _changes(last: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """`now` with only its steps that differ from `last`'s."""
    before = last["steps"]
    return {**now, "steps": {k: v for k, v in now["steps"].items() if before.get(k) != v}}


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def run_events(store: Store, broker: Broker, run_id: int, *, poll: float = 1.0) -> AsyncIterator[str]:
    """`run` with the run's summary and every step first, then `run` again with only the
    steps that changed since the one before (a 1000-step run sends a few, not a thousand),
    and `end` once it has settled."""
    last: dict[str, Any] | None = None
    quiet = 0.0
    while True:
        try:
            run = await store.get_run(run_id)
            now = summary(run, await store.list_steps(run_id))
        except StoreError:
            return  # the database went: the stream ends, and the outage is said once elsewhere
        if now != last:
            yield _event("run", now if last is None else _changes(last, now))
            last, quiet = now, 0.0
        if settled(run):
            yield _event("end", {"run_id": run_id, "status": run.status, "cleanup_status": run.cleanup_status})
            return
        await broker.wait(run_id, poll)
        quiet += poll
        if quiet >= KEEPALIVE:
            yield ": keepalive\n\n"
            quiet = 0.0


async def watch_events(
    look: Callable[[], Awaitable[Any]], broker: Broker, *, poll: float = 1.0, run_id: int = ANY_RUN
) -> AsyncIterator[str]:
    """`watching` once the first answer of `look()` is read (what changes after it is
    heard: a page drawn before looks again), then `change` each time an answer differs
    from the one before, woken early by news of `run_id`'s (default: any run's); it runs
    until the viewer leaves."""
    try:
        last = await look()
    except StoreError:
        return
    quiet = 0.0
    yield _event("watching", {})
    while True:
        await broker.wait(run_id, poll)
        try:
            now = await look()
        except StoreError:
            return  # the database went: the stream ends, and the outage is said once elsewhere
        if now != last:
            yield _event("change", {})
            last, quiet = now, 0.0
            continue
        quiet += poll
        if quiet >= KEEPALIVE:
            yield ": keepalive\n\n"
            quiet = 0.0


async def merged(streams: dict[str, AsyncIterator[str]], down: Callable[[], Any] | None = None) -> AsyncIterator[str]:
    """Many streams as one: each event of the stream subscribed as `key` is sent on with
    its data as `{"sub": key, "data": ...}`; it ends when every stream has. One connection
    then serves every live part of every tab of a browser (live-worker.js), where a stream
    each would pass the six connections a browser allows one host over HTTP/1.1 and stop
    the site's next page from loading. While `down()` says the database cannot be used, it
    sends `outage` with what it says and ends: the browser looks at /healthz until it is
    back, then opens the stream again."""
    queue: asyncio.Queue[tuple[str, str | None, str]] = asyncio.Queue()

    async def pump(key: str, stream: AsyncIterator[str]) -> None:
        try:
            async for chunk in stream:
                if chunk.startswith("event: "):
                    name, _, rest = chunk[len("event: ") :].partition("\n")
                    await queue.put((key, name, rest.removeprefix("data: ").strip()))
        except StoreError:
            pass  # the database went: the outage is said once, by web/outage.py
        except Exception as exc:  # one stream's failure ends that one, not the others
            log.warning("live stream %s stopped: %s: %s", key, type(exc).__name__, exc)
        finally:
            await queue.put((key, None, ""))

    tasks = [asyncio.create_task(pump(key, stream)) for key, stream in streams.items()]
    running = len(tasks)
    try:
        yield ": streaming\n\n"
        quiet = 0.0
        while running:
            outage = down() if down is not None else None
            if outage is not None:
                yield _event("outage", {"message": outage.message})
                return
            try:
                key, name, data = await asyncio.wait_for(queue.get(), 1.0)
            except TimeoutError:
                quiet += 1.0
                if quiet >= KEEPALIVE:
                    yield ": keepalive\n\n"
                    quiet = 0.0
                continue
            if name is None:
                running -= 1
                continue
            yield f'event: {name}\ndata: {{"sub": {json.dumps(key)}, "data": {data}}}\n\n'
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

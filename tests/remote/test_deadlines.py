"""Nothing waits on a push module for ever, and the push client reads one clock: a request
the server never answers ends with a retryable StepTimeout after the call's deadline on
the injectable clock, and requests are signed, and side calls backed off, on that clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx2 as httpx  # what the push transport is built on
import pytest

from roadie import protocol
from roadie.clock import FakeClock
from roadie.errors import StepTimeout
from roadie.registry import LeaseCall
from roadie.remote.client import PushTransport, RemoteModule, RemoteSettings

SECRET = "deadline-secret"
MANIFEST = protocol.Manifest(module="world", leases=[protocol.LeaseSpec(name="weather", targeted=True)])


async def _advance_until_done(clock: FakeClock, work: asyncio.Future[Any]) -> None:
    """Move the fake clock to each deadline someone waits on, until `work` ends."""
    async with asyncio.timeout(10):  # a guard on the test, not a pace: the clock is moved by hand
        while not work.done():
            deadline = clock.next_deadline()
            if deadline is None:
                await asyncio.sleep(0)
                continue
            clock.set(deadline)
            await asyncio.sleep(0)


def test_a_push_server_that_never_answers_times_out_on_the_clock() -> None:
    """The server takes the request and never answers: the caller gets StepTimeout once
    `call_timeout` has passed on the fake clock; every attempt was signed at the fake
    clock's time; the side call's retries waited on that clock too."""

    async def body() -> None:
        clock = FakeClock(datetime(2026, 6, 1, tzinfo=UTC))
        seen: list[str] = []
        never = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request.headers[protocol.H_TIMESTAMP])
            await never.wait()
            raise AssertionError("unreachable")

        settings = RemoteSettings(name="world", transport="push", url="http://world", secret=SECRET, call_timeout=20)
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://world")
        transport = PushTransport(settings, client=http, clock=clock)
        module = RemoteModule(MANIFEST, transport, clock=clock).build()
        lease = module.leases["weather"]
        assert lease.restore_fn is not None
        call = LeaseCall("weather", "britain", None, clock, idempotency_key="restore-7-12", run_id=7)
        started = clock.now()
        work = asyncio.ensure_future(lease.restore_fn(call, "clear"))
        await _advance_until_done(clock, work)
        with pytest.raises(StepTimeout) as raised:
            work.result()
        assert raised.value.retryable
        assert (clock.now() - started).total_seconds() >= 20
        assert len(seen) >= 2  # retried, across the fake clock's backoff
        assert seen[0] == str(int(started.timestamp()))
        await http.aclose()

    asyncio.run(body())

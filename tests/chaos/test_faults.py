"""Faults from outside the engine: the database failing under it, a full disk, and a
module that delivers twice or loses its answers.

Each test ends the same way: the run finishes, its cleanup is complete, and the world is
what it was before the run.
"""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import text

from roadie.errors import StoreError
from roadie.store import dialects
from tests.conftest import Harness

HELD = """
id: held
cleanup: auto
phases:
  - name: only
    steps:
      - action: probe.make
        name: slow
        with: {hold: 30, answer: [{kind: thing, ref: slow}]}
"""


def test_a_failed_claim_does_not_drop_the_dispatches_in_flight(harness: Harness) -> None:
    """The database fails a claim while a dispatch is in flight (a lost connection
    mid-commit): the dispatch still answers and is recorded in the same pass, instead of
    being cancelled after it wrote the world and left for its claim to expire."""
    claims = Counter[str]()

    def fail_second_claim(name: str) -> None:
        claims[name] += 1
        if name == "claim_steps" and claims[name] == 2:
            raise StoreError("claim_steps: the connection was lost while committing")

    async def body() -> None:
        run = await harness.start(HELD)
        harness.write_points.extra = fail_second_claim
        await harness.drive(harness.engine.tick())
        assert claims["claim_steps"] >= 2, "the second claim should have come while the step was in flight"
        [call] = harness.probe.calls
        assert call.outcome == "answered"
        step = await harness.step(run, "slow")
        assert step.status == "succeeded"
        harness.write_points.extra = None
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == ("succeeded", "complete")

    harness.run(body)


def test_a_failed_heartbeat_does_not_drop_the_dispatches_in_flight(harness: Harness) -> None:
    """The heartbeat's write fails while a dispatch is in flight: the drain carries on (a
    claim outlives two missed beats) and the answer is recorded."""

    def fail_heartbeats(name: str) -> None:
        if name == "heartbeat_worker":
            raise StoreError("heartbeat_worker: database is locked")

    async def body() -> None:
        run = await harness.start(HELD)
        harness.write_points.extra = fail_heartbeats
        await harness.drive(harness.engine.tick())
        [call] = harness.probe.calls
        assert call.outcome == "answered"
        assert (await harness.step(run, "slow")).status == "succeeded"

    harness.run(body)


# -- the database server drops the engine's connections ---------------------------------------


async def kill_connections(url: str) -> int:
    """Drop every connection to the database at `url` but this one, as a server restart
    would (without restarting a server other people's tests use). Answers how many."""
    engine = dialects.create_engine(url, isolation_level="AUTOCOMMIT")
    name = engine.url.database
    try:
        async with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                found = await conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )
                return len(found.all())
            ids = [
                row[0]
                for row in await conn.execute(
                    text("SELECT id FROM information_schema.processlist WHERE db = :name AND id <> CONNECTION_ID()"),
                    {"name": name},
                )
            ]
            for connection_id in ids:
                await conn.execute(text(f"KILL {int(connection_id)}"))
            return len(ids)
    finally:
        await engine.dispose()


def test_the_store_reconnects_after_the_server_drops_its_connections(harness: Harness) -> None:
    """Every pooled connection is killed by the server: the next read and the next write
    notice, open new connections, and succeed, instead of failing the caller."""
    if harness.database_url.startswith("sqlite"):
        pytest.skip("a file has no connections to drop")

    async def body() -> None:
        run = await harness.start(HELD.replace("hold: 30", "hold: 0"))
        assert await kill_connections(harness.database_url) >= 1
        assert (await harness.get_run(run)).status == "pending"  # a read
        assert await kill_connections(harness.database_url) >= 1
        await harness.engine.cancel_run(run.id)  # a write
        assert await kill_connections(harness.database_url) >= 1
        [run] = await harness.settle(run)
        assert run.status == "cancelled"

    harness.run(body)

"""A claim takes the first ready steps in `(not_before, id)` order from an index in that
order: it reads as many ready steps as it takes, however long the queue, and never sorts
the queue (migration 0015: PostgreSQL's index had no id, and every claim read, joined and
sorted every ready step to take the first hundred)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from tests.conftest import Harness

from roadie.store import runs as runs_queries
from roadie.store.drain import _claiming

QUEUE = 300
TAKEN = 20


def _long_phase() -> str:
    steps = "\n".join(f"      - action: probe.make\n        name: s{i}\n        with: {{}}" for i in range(QUEUE))
    return f"id: queue\ncleanup: manual\nphases:\n  - name: only\n    steps:\n{steps}\n"


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def test_a_claim_reads_only_the_ready_steps_it_takes(harness: Harness) -> None:
    async def body() -> None:
        store = harness.store
        await harness.start(_long_phase())
        await harness.engine._advance()  # the phase's steps materialised, all ready, none claimed
        compiled = _claiming(store.dialect).compile(dialect=store.engine.dialect)
        now = harness.clock.now().replace(tzinfo=None)  # as the store writes times: UTC, naive
        given = {
            **compiled.params,
            "b_now": now,
            "b_limit": TAKEN,
            "b_worker": "w",
            "b_token": "t",
            "b_expires": now + timedelta(seconds=60),
        }
        async with store.engine.connect() as conn:
            if store.dialect == "postgresql":
                explained = await conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}", given)
                plan = explained.scalar_one()
                plan = json.loads(plan) if isinstance(plan, str) else plan
                nodes = _nodes(plan[0]["Plan"])
                assert not [n for n in nodes if n["Node Type"] == "Sort"], nodes
                [queue] = [n for n in nodes if n.get("Alias") == "steps_1"]  # the ready steps' scan
                assert (queue["Node Type"], queue["Actual Rows"]) == ("Index Scan", TAKEN), queue
            elif store.dialect == "sqlite":
                values = tuple(
                    str(v) if k in ("b_now", "b_expires") else v
                    for k, v in ((k, given[k]) for k in compiled.positiontup or ())
                )
                explained = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", values)
                details = [r[-1] for r in explained]
                assert not [d for d in details if "TEMP B-TREE" in d], details
                assert [d for d in details if "ix_steps_status_not_before_id" in d], details
            else:  # MariaDB claims by a locking read of its own, whose index InnoDB ends with the id
                explained = await conn.exec_driver_sql(
                    "EXPLAIN SELECT id FROM steps WHERE status = 'ready' AND not_before <= %s "
                    "ORDER BY not_before, id LIMIT %s FOR UPDATE SKIP LOCKED",
                    (now, TAKEN),
                )
                extras = [str(r._mapping["Extra"] or "") for r in explained]
                assert not [e for e in extras if "filesort" in e], extras
            await conn.rollback()

    harness.run(body)


def test_many_steps_materialised_at_once_have_postgresql_count_the_table_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until PostgreSQL has counted the steps, it plans the claim for the table it last
    counted: a queue of tens of thousands it takes for a few, and reads and sorts them all
    at every claim (`benchmarks/claim_queue.py`). A phase of many steps has it count them
    at once (here from `QUEUE` steps rather than 5,000)."""
    if not harness.database_url.startswith("postgresql"):
        pytest.skip("SQLite's and InnoDB's claim reads its index in order whatever they have counted")
    monkeypatch.setattr(runs_queries, "ANALYZE_AFTER", QUEUE)

    async def counted() -> float:
        async with harness.store.engine.connect() as conn:
            found = await conn.exec_driver_sql("SELECT reltuples FROM pg_class WHERE relname = 'steps'")
            return float(found.scalar_one())

    async def body() -> None:
        await harness.start(_long_phase())
        await harness.engine._advance()
        assert await counted() == QUEUE

    harness.run(body)

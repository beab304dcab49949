"""A run's view as the driver gives it (`Store.run_view_undecoded`): the run page keeps
what it drew from an ended run for as long as this reads back the same, so every change to
the run, its steps or its ledger rows must change it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from tests.conftest import Harness
from tests.integration.test_ledger_rules import THING, one_step

from roadie.store import tables


def _parts(view: frozenset[tuple[Any, ...]]) -> list[set[tuple[Any, ...]]]:
    """The run's row, its steps' and its ledger rows', as the view tags them."""
    return [{row for row in view if str(row[0]) == str(tag)} for tag in range(3)]


def test_the_undecoded_view_changes_with_every_part_of_the_run(harness: Harness) -> None:
    async def body() -> None:
        run = await harness.start(one_step({"answer": [THING]}, cleanup="manual"))
        await harness.settle(run)
        other = await harness.start(one_step({"answer": [{"kind": "thing", "ref": "thing-2"}]}, cleanup="manual"))
        await harness.settle(other)
        store = harness.store
        seen = await store.run_view_undecoded(run.id)
        assert [len(part) for part in _parts(seen)] == [1, 1, 2]  # the run; its step; placeholder and thing
        assert await store.run_view_undecoded(run.id) == seen
        assert await store.run_view_undecoded(other.id) != seen

        # Another run's cleanup leaves this one's view as it was.
        await harness.engine.clean_up(other.id)
        assert await store.run_view_undecoded(run.id) == seen

        async def changed(table: tables.Table, **values: object) -> list[set[tuple[Any, ...]]]:
            async with store.engine.begin() as conn:
                await conn.execute(update(table).where(table.c.run_id == run.id).values(**values))
            return _parts(await store.run_view_undecoded(run.id))

        before = _parts(seen)
        step_changed = await changed(tables.steps, error="noted")
        assert step_changed[1] != before[1]
        assert step_changed[0] == before[0]
        assert step_changed[2] == before[2]

        # Its cleanup changes both its row and its ledger rows.
        await harness.engine.clean_up(run.id)
        cleaned = _parts(await store.run_view_undecoded(run.id))
        assert cleaned[0] != step_changed[0]
        assert cleaned[2] != step_changed[2]
        assert cleaned[1] == step_changed[1]

        missing = await store.run_view_undecoded(run.id + 1000)
        assert missing == frozenset()

    harness.run(body)

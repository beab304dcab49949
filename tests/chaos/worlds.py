"""What the chaos suite checks after every trial: the world is what it was, nothing was
made or reverted twice, and the ledger is final.

The sandbox's effects log is the witness: every object a key made is a `create`, every
removal a `remove`, every lease write a `set`, whichever process did it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from roadie.states import CleanupStatus, RunStatus
from roadie.store import Store, tables

FINAL_STATES = {"resolved", "reverted", "abandoned"}


@dataclass
class EffectsTally:
    """The effects log, read for the invariants."""

    created: int  # objects (creatures and items) made
    removed: int  # objects removed by their key
    made_twice: list[tuple[Any, ...]]  # (key, kind, idx) made more than once
    removed_twice: list[tuple[Any, ...]]  # (kind, serial) removed more than once
    never_removed: list[tuple[Any, ...]]  # objects made and still not removed
    lease_writes: int  # `set` effects (borrows and restores, a repeat included)


def tally_effects(effects: list[dict[str, Any]]) -> EffectsTally:
    objects = [e for e in effects if e["op"] == "create" and e["kind"] in ("creature", "item")]
    made = Counter((e["key"], e["kind"], e["idx"]) for e in objects)
    removals = [e for e in effects if e["op"] == "remove"]
    removed = Counter((e["kind"], e["ref"]) for e in removals)
    gone = set(removed)
    return EffectsTally(
        created=len(objects),
        removed=len(removals),
        made_twice=[k for k, n in made.items() if n > 1],
        removed_twice=[k for k, n in removed.items() if n > 1],
        never_removed=[(e["kind"], e["ref"]) for e in objects if (e["kind"], e["ref"]) not in gone],
        lease_writes=sum(1 for e in effects if e["op"] == "set"),
    )


def assert_world_invariants(effects: list[dict[str, Any]], before: dict[str, Any], after: dict[str, Any]) -> None:
    """The world equals its start; no object was made twice or removed twice; every
    object made was removed."""
    assert after == before, "the world is not what it was before the run"
    tally = tally_effects(effects)
    assert tally.made_twice == [], f"objects made twice: {tally.made_twice[:5]}"
    assert tally.removed_twice == [], f"objects reverted twice: {tally.removed_twice[:5]}"
    assert tally.never_removed == [], f"objects never reverted: {tally.never_removed[:5]}"


async def live_rows_per_target(store: Store) -> list[tuple[Any, ...]]:
    """Targets held by two pending/live rows at once (there must be none)."""
    r = tables.run_resources.c
    query = (
        select(r.owner, r.kind, r.ref, func.count())
        .where(r.state.in_(["pending", "live"]))
        .group_by(r.owner, r.kind, r.ref)
        .having(func.count() > 1)
    )
    async with store.engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(query)]


async def unfinished_runs(store: Store, run_ids: list[int]) -> list[str]:
    """Why each of these runs is not done with (empty when all ended, cleaned up
    completely, with every ledger row final)."""
    problems = []
    for run_id in run_ids:
        run = await store.get_run(run_id)
        if not RunStatus(run.status).terminal:
            problems.append(f"run {run_id} is {run.status}")
        rows = await store.list_resources(run_id)
        live = [(r.id, r.kind, r.ref, r.state, r.error) for r in rows if r.state not in FINAL_STATES]
        if live:
            problems.append(f"run {run_id}: ledger rows not final: {live[:5]}")
        if rows and run.cleanup_status != CleanupStatus.COMPLETE.value:
            problems.append(f"run {run_id}: cleanup {run.cleanup_status}")
    doubles = await live_rows_per_target(store)
    if doubles:
        problems.append(f"two live rows for one target: {doubles[:5]}")
    return problems


def unfinished_at(url: str, run_ids: list[int]) -> list[str]:
    """`unfinished_runs` on the database at `url`, opened for it and closed again."""

    async def look() -> list[str]:
        store = await Store.open(url, migrate_schema=False)
        try:
            return await unfinished_runs(store, run_ids)
        finally:
            await store.close()

    return asyncio.run(look())

"""Four worker processes on one database, killed with SIGKILL at random and restarted.

What this proves, for each database the suite runs on: every run reaches a terminal
state and a complete cleanup; the sandbox's effect log shows each object of each step
made exactly once and removed exactly once (the key ledger makes retries exact); no
step was in two workers' hands at once (the sandbox's dispatch log, with a killed
process's open call ending at its kill time); and the world ends equal to its start.

The event and the fleet of workers are in tests/chaos/fleet.py.

`ROADIE_CHAOS_RUNS` sets the number of runs (default 30; `make chaos`: 100); `ROADIE_CHAOS_SEED` the seed
of the kills.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from roadie.clock import SystemClock
from roadie.modules.sandbox import SandboxWorld
from roadie.store.rows import RunRow
from tests.chaos.fleet import Fleet, create_runs, overlaps, runs_now, settled, steps_by_key
from tests.databases import Database

RUNS = int(os.environ.get("ROADIE_CHAOS_RUNS", "30"))
SEED = int(os.environ.get("ROADIE_CHAOS_SEED", str(random.randrange(1 << 30))))
WORKERS = 4
CLAIM_TTL = 3.0
CHAOS_SECONDS = 15.0  # workers are killed during this long, then left to finish
DEADLINE = 150.0 + RUNS * 1.0


@pytest.mark.slow
@pytest.mark.timeout(int(DEADLINE) + 120)
def test_killed_workers_lose_nothing_and_no_step_runs_twice_at_once(database: Database, tmp_path: Path) -> None:
    """4 workers, killed with SIGKILL at random moments and replaced, carry 30 runs of a
    3-phase event to the end: every run succeeds and is cleaned up completely, each
    object was made once and removed once, no key was in two calls at once, the world
    ends as it began, and the surviving workers stop cleanly on SIGTERM."""
    url = database.fresh(tmp_path)
    try:
        _chaos(database, url, tmp_path)
    finally:
        database.drop_all()


def _chaos(database: Database, url: str, tmp_path: Path) -> None:
    world_path = tmp_path / "world.db"
    (tmp_path / "roadie.toml").write_text(
        f'[engine]\nclaim_ttl = {CLAIM_TTL}\npoll_interval = 0.2\n\n[modules.sandbox]\ndb = "{world_path.name}"\n'
    )
    rng = random.Random(SEED)
    print(f"chaos seed {SEED}, {RUNS} runs on {database.backend}")
    ids, before = asyncio.run(create_runs(url, world_path, RUNS))
    fleet = Fleet(tmp_path, url)
    try:
        for _ in range(WORKERS):
            fleet.start()
        began = time.monotonic()
        next_kill = began + rng.uniform(0.5, 1.5)
        runs: list[RunRow] = []
        while time.monotonic() - began < DEADLINE:
            now = time.monotonic()
            if now - began < CHAOS_SECONDS and now >= next_kill:
                fleet.kill(rng)
                fleet.start()
                next_kill = now + rng.uniform(0.5, 1.5)
            runs = asyncio.run(runs_now(url, ids))
            if all(settled(r) for r in runs) and now - began >= CHAOS_SECONDS:
                break
            time.sleep(0.25)
        codes = fleet.stop()
    finally:
        fleet.abort()
    unsettled = [(r.id, r.status, r.cleanup_status) for r in runs if not settled(r)]
    assert not unsettled, f"runs not settled by the deadline (seed {SEED}): {unsettled[:10]}"
    assert fleet.killed, "no worker was killed: the test proved nothing"
    assert codes == [0] * len(codes), f"workers did not stop cleanly on SIGTERM: {codes}"
    assert {(r.status, r.cleanup_status) for r in runs} == {("succeeded", "complete")}, Counter(
        (r.status, r.cleanup_status, r.error) for r in runs
    )

    with SandboxWorld(str(world_path), SystemClock()) as world:
        after = world.snapshot()
        effects = world.effects()
        ledger = world.key_ledger()
        dispatches = world.dispatches()
    assert after == before, "the world did not end as it began"

    # Each object of each step made exactly once, and removed exactly once by its key.
    made = Counter((e["key"], e["kind"], e["idx"]) for e in effects if e["op"] == "create" and e["kind"] != "broadcast")
    assert made
    assert set(made.values()) == {1}, [k for k, n in made.items() if n > 1][:10]
    maker = {e["ref"]: e["key"] for e in effects if e["op"] == "create" and e["kind"] in ("creature", "item")}
    removed = Counter((e["key"], e["ref"]) for e in effects if e["op"] == "remove")
    assert removed == Counter((key, ref) for ref, key in maker.items())
    expected = {"orcs": 3, "chests": 2, "trolls": 2, "gold": 3}
    assert len(maker) == RUNS * sum(expected.values())
    broadcasts = Counter(e["key"] for e in effects if e["op"] == "create" and e["kind"] == "broadcast")
    assert len(broadcasts) == RUNS
    assert set(broadcasts.values()) == {1}
    # Every world-writing step's key has one stored answer in the key ledger.
    world_steps = {k: s for k, s in asyncio.run(steps_by_key(url, ids)).items() if s.action != "core.lease"}
    assert set(world_steps) <= set(ledger)

    problems = overlaps(dispatches, fleet.killed)
    assert not problems, problems[:10]
    retried = sum(1 for s in world_steps.values() if s.attempts > 1)
    kills, calls = len(fleet.killed), len(dispatches)
    print(f"{kills} kills, {fleet.started} workers started, {retried} steps retried, {calls} calls")

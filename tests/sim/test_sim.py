"""The deterministic simulation at CI size, on every backend (DESIGN §10, §11).

Several engines share one database, with a web process and a game server beside them; a
seeded scheduler interleaves their drains, cleanups, sweeps, late reports, staff clicks,
cancels, claim expiries and crashes at named write points, workers cut off from the
database whose world calls land late, staff forgetting rows and editing settings by hand,
and world restarts, and the invariants are checked after every step. `--sim-seeds` (or
`ROADIE_SIM_SEEDS`) sizes the run; `make chaos` runs it at the size the docs report.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.databases import BACKENDS, check_reachable
from tests.sim.databases import SeedDatabases
from tests.sim.figures import Figures
from tests.sim.simulation import quiet_logging, run_seed

# Seeds per backend at CI size: about 70 s on SQLite, 25-30 s on each server (2 shared cores).
CI_SEEDS = {"sqlite": 20, "postgresql": 4, "mariadb": 4}


@pytest.fixture(params=[b for b in BACKENDS if b in CI_SEEDS])  # a pooler changes no interleaving
def seed_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SeedDatabases]:
    """A database for a seed at a time, on each backend. An unreachable server skips
    locally and fails in CI."""
    problem = check_reachable(request.param)
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    quiet_logging()
    databases = SeedDatabases(request.param, tmp_path)
    yield databases
    databases.close()


def _seeds(request: pytest.FixtureRequest, backend: str) -> int:
    asked: int | None = request.config.getoption("--sim-seeds")
    if asked is None:
        return CI_SEEDS[backend]
    return asked if backend == "sqlite" else max(1, asked // 5)


@pytest.mark.timeout(0)
def test_no_seed_breaks_an_invariant(request: pytest.FixtureRequest, seed_databases: SeedDatabases) -> None:
    """Whatever the interleaving of workers, staff, game server, clock and crashes, no
    world write goes unrecorded, nothing is reverted twice, no target has two live rows,
    no lease is given back over another run's value, a complete cleanup leaves nothing
    live, every dispatch counts, no call lands after a newer owner's, no value set by
    hand is written over, a forgotten row stays forgotten, and once every run has cleaned
    up the world is what it was (but where a hand edit stands or staff forgot a row). A
    failure names each seed, the invariant and the scheduler's trace."""
    figures = Figures(seed_databases.backend)
    began = time.monotonic()
    failures = []
    for seed in range(_seeds(request, seed_databases.backend)):
        result = run_seed(seed, seed_databases)
        figures.add(result)
        if result.violations:
            failures.append(result.describe(tail=25))
    figures.seconds = time.monotonic() - began
    report = os.environ.get("ROADIE_CHAOS_REPORT")
    if report:
        with open(report, "a") as out:
            out.write(json.dumps(figures.as_dict()) + "\n")
    assert not failures, figures.table() + "\n\n" + "\n\n".join(failures[:3])


def test_a_seed_replays_exactly(seed_databases: SeedDatabases) -> None:
    """The same seed makes the same choices, in the same order, to the same world: a
    failing seed can be replayed with `python -m tests.sim --seed S`."""
    first = run_seed(3, seed_databases)
    second = run_seed(3, seed_databases)
    assert len(first.trace) > 100
    assert first.trace == second.trace
    assert first.world_log == second.world_log
    assert [(v.invariant, v.step, v.what) for v in first.violations] == [
        (v.invariant, v.step, v.what) for v in second.violations
    ]

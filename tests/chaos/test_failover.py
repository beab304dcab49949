"""PostgreSQL failover under working workers: the primary dies mid-run (stopped
immediately, as a crash would), its synchronous standby is promoted, and the workers,
given both servers in one multi-host URL with `target_session_attrs=read-write`, carry
on against the new primary. Every run ends and is cleaned up completely, each object was
made once and removed once, and the world ends as it began: 0 resources lost.

Two clusters of the test's own (tests/chaos/clusters.py) on this machine, on two ports:
the primary waits for the standby on every commit (`synchronous_standby_names`,
`synchronous_commit = on`), so what Roadie was told is committed is on both. After a
failover, a new standby is made from the new primary on the dead one's port, so that
`ROADIE_FAILOVERS` (default 1; `make chaos` more) failovers can follow one another.

`ROADIE_FAILOVER_RUNS` sets the number of runs (default 12).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from roadie.clock import SystemClock
from roadie.modules.sandbox import SandboxWorld
from tests.chaos import clusters
from tests.chaos.clusters import Cluster
from tests.chaos.fleet import Fleet, all_settled, create_runs, require, runs_now, settled
from tests.chaos.test_faults import _report
from tests.chaos.worlds import assert_world_invariants, tally_effects, unfinished_at

RUNS = int(os.environ.get("ROADIE_FAILOVER_RUNS", "12"))
FAILOVERS = int(os.environ.get("ROADIE_FAILOVERS", "1"))
WORKERS = 3
OBJECTS_PER_RUN = 10  # orcs 3, chests 2, trolls 2, gold 3 (tests/chaos/fleet.py's event)
SETTINGS = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "synchronous_commit": "on",
    "max_connections": "200",
}


def _reached(world_path: Path, objects: int) -> bool:
    """Whether the world has seen `objects` made, in all."""
    with SandboxWorld(str(world_path), SystemClock()) as world:
        return tally_effects(world.effects()).created >= objects


def _sync(primary: Cluster, standby: str) -> None:
    """Have `primary` wait for `standby` on every commit, from now on."""
    primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{standby}'")
    primary.sql("SELECT pg_reload_conf()")
    primary.wait_for_sync_standby(standby)


@pytest.fixture
def made() -> Iterator[list[Cluster]]:
    """The clusters a test makes, stopped and removed when it ends, passed or failed (not
    only when the test process exits)."""
    found: list[Cluster] = []
    yield found
    for cluster in found:
        cluster.remove()


@pytest.mark.chaos
@pytest.mark.timeout(300 + 120 * FAILOVERS)
def test_workers_carry_on_when_the_primary_dies_and_its_synchronous_standby_takes_over(
    tmp_path: Path, made: list[Cluster]
) -> None:
    require(clusters.missing())
    primary = Cluster("primary").init(SETTINGS).start()
    made.append(primary)
    standby = primary.standby("standby1")
    made.append(standby)
    _sync(primary, "standby1")
    primary.sql("CREATE DATABASE test")
    url = (
        f"postgresql://postgres@/test?host=127.0.0.1:{primary.port}&host=127.0.0.1:{standby.port}"
        "&target_session_attrs=read-write&connect_timeout=2"
    )
    world_path = tmp_path / "world.db"
    (tmp_path / "roadie.toml").write_text(
        f'[engine]\nclaim_ttl = 3\npoll_interval = 0.2\n\n[modules.sandbox]\ndb = "{world_path.name}"\n'
    )
    ids, before = asyncio.run(create_runs(url, world_path, RUNS))
    fleet = Fleet(tmp_path, url)
    in_flight: list[int] = []
    down: list[float] = []
    try:
        for _ in range(WORKERS):
            fleet.start()
        for round_ in range(1, FAILOVERS + 1):
            goal = RUNS * OBJECTS_PER_RUN * round_ // (FAILOVERS + 1)
            fleet.wait_until(f"{goal} objects made", partial(_reached, world_path, goal), 120)
            in_flight.append(sum(not settled(r) for r in asyncio.run(runs_now(url, ids))))
            began = time.monotonic()
            primary.stop("immediate")
            standby.promote()
            down.append(time.monotonic() - began)
            # The new primary has no standby yet: commits wait for none until it has.
            standby.sql("ALTER SYSTEM RESET synchronous_standby_names")
            standby.sql("SELECT pg_reload_conf()")
            dead, primary = primary, standby
            dead.remove()
            if round_ < FAILOVERS:
                standby = primary.standby(f"standby{round_ + 1}", port=dead.port)
                made.append(standby)
                _sync(primary, f"standby{round_ + 1}")
        fleet.wait_until("every run settled", lambda: all_settled(url, ids), 240)
        codes = fleet.stop()
    finally:
        fleet.abort()
    assert codes == [0] * WORKERS, f"workers did not stop cleanly on SIGTERM: {codes}"
    assert all(n > 0 for n in in_flight), f"a failover came after every run had ended: {in_flight}"
    logs = [p.read_text(errors="replace") for p in fleet.home.glob("worker-*.log")]
    assert any("reconnecting" in log for log in logs), "no worker saw the primary go"

    assert unfinished_at(url, ids) == []
    ended = {(r.status, r.error) for r in asyncio.run(runs_now(url, ids))}
    assert ended == {("succeeded", None)}, ended  # a failover fails no run
    with SandboxWorld(str(world_path), SystemClock()) as world:
        effects, after = world.effects(), world.snapshot()
    assert_world_invariants(effects, before, after)
    tally = tally_effects(effects)
    assert tally.created == RUNS * OBJECTS_PER_RUN
    _report(
        {
            "suite": "failover",
            "runs": RUNS,
            "failovers": FAILOVERS,
            "runs_in_flight": in_flight,
            "objects": tally.created,
            "resources_lost": len(tally.never_removed),
            "removed_twice": len(tally.removed_twice),
            "down_seconds": [round(d, 1) for d in down],
        }
    )

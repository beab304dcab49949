"""A PostgreSQL server stopped and started again in the middle of a run: a `roadie worker`
reconnects and carries on, and every run ends cleaned up, the world as it began.

The server is a cluster of the test's own (`tests/chaos/clusters.py`, the machine's
PostgreSQL binaries on a port of its own): stopping the machine's server, as this test
once did, cut every other test process's connections to it (`make test` runs two).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from roadie.clock import SystemClock
from roadie.modules.sandbox import SandboxWorld
from roadie.store import Store
from tests.chaos import clusters
from tests.chaos.clusters import Cluster
from tests.chaos.fleet import require
from tests.chaos.test_faults import _create_worker_runs, _report, _settled, start_worker
from tests.chaos.worlds import assert_world_invariants, unfinished_at


@pytest.fixture
def server() -> Iterator[Cluster]:
    """A PostgreSQL server of the test's own with an empty database `test`, removed when
    the test ends."""
    require(clusters.missing())
    cluster = Cluster("restart").init({}).start()
    try:
        cluster.sql("CREATE DATABASE test")
        yield cluster
    finally:
        cluster.remove()


def _succeeded_steps(url: str, ids: list[int]) -> int:
    async def count() -> int:
        store = await Store.open(url, migrate_schema=False)
        try:
            done = 0
            for run_id in ids:
                done += sum(1 for s in await store.list_steps(run_id) if s.status == "succeeded")
            return done
        finally:
            await store.close()

    return asyncio.run(count())


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_a_worker_carries_on_across_a_postgresql_restart(server: Cluster, tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{server.port}/test"
    world_path = tmp_path / "world.db"
    ids, before = asyncio.run(_create_worker_runs(url, world_path))
    worker, log_path = start_worker(url, tmp_path, claim_ttl=10)
    try:
        deadline = time.monotonic() + 60
        while _succeeded_steps(url, ids) < 3:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        started = time.monotonic()
        server.stop("fast")
        time.sleep(2.0)  # down for a while, as a real restart is
        server.start()
        down = time.monotonic() - started
        deadline = time.monotonic() + 120
        while not asyncio.run(_settled(url, ids)):
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.3)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    output = log_path.read_text()
    assert code == 0, output[-3000:]
    assert "reconnecting" in output, "the worker never saw the server go"

    assert unfinished_at(url, ids) == []
    with SandboxWorld(str(world_path), SystemClock()) as world:
        world.clear_faults()
        assert_world_invariants(world.effects(), before, world.snapshot())
    _report({"suite": "restart", "backend": "postgresql", "runs": len(ids), "down_seconds": round(down, 1)})

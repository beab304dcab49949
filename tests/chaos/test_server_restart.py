"""The PostgreSQL server itself stopped and started again in the middle of a run: a
`roadie worker` reconnects and carries on, and every run ends cleaned up, the world as it
began.

This restarts the machine's PostgreSQL, so it runs only where the suite may do that: with
`ROADIE_CHAOS_RESTART=1`, or in CI (`CI=true`), where nothing else uses the server while
the suite runs. Elsewhere it is skipped, saying so.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from roadie.clock import SystemClock
from roadie.modules.sandbox import SandboxWorld
from roadie.store import Store
from tests.chaos.test_faults import _create_worker_runs, _report, _settled, start_worker
from tests.chaos.worlds import assert_world_invariants, unfinished_at
from tests.databases import Database


def _cluster() -> list[str] | None:
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return None
    versions = sorted(os.listdir("/etc/postgresql"))
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main"] if versions else None


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
def test_a_worker_carries_on_across_a_postgresql_restart(database: Database, tmp_path: Path) -> None:
    if database.backend != "postgresql":
        pytest.skip("restarts the PostgreSQL server")
    allowed = os.environ.get("ROADIE_CHAOS_RESTART") == "1" or os.environ.get("CI") == "true"
    cluster = _cluster()
    if not allowed:
        pytest.skip("restarts the machine's PostgreSQL: set ROADIE_CHAOS_RESTART=1 (CI does)")
    if cluster is None or os.geteuid() != 0:
        pytest.fail("pg_ctlcluster (as root) is needed to restart PostgreSQL")
    url = database.fresh(tmp_path)
    try:
        world_path = tmp_path / "world.db"
        ids, before = asyncio.run(_create_worker_runs(url, world_path))
        worker, log_path = start_worker(url, tmp_path, claim_ttl=10)
        try:
            deadline = time.monotonic() + 60
            while _succeeded_steps(url, ids) < 3:
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.1)
            started = time.monotonic()
            subprocess.run([*cluster, "stop", "-m", "fast"], check=True, capture_output=True)
            time.sleep(2.0)  # down for a while, as a real restart is
            subprocess.run([*cluster, "start"], check=True, capture_output=True)
            down = time.monotonic() - started
            deadline = time.monotonic() + 120
            while True:
                try:
                    if asyncio.run(_settled(url, ids)):
                        break
                except Exception:  # the server is still starting
                    pass
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
    finally:
        database.drop_all()

"""Workers on hosts of their own, across a real network that fails: each `roadie worker`
runs in a network namespace of its own (tests/chaos/hosts.py), reaching the PostgreSQL
server and the world's module server (`roadie sandbox serve`, push) over a bridge. The
test cuts hosts off (from everything, or from the database alone), makes links lossy and
slow, and heals them, while the workers carry runs; then it checks DESIGN §10's
invariants: every run ends and is cleaned up completely (a cleanup whose reverts found
the world out of reach ends `incomplete`, and is retried as an operator would, with
`roadie cleanup RUN --again`), each object was made once and
removed once, the world ends as it began; and a worker cut off from the database while
it held answers has its claims taken over and its late record refused.

The database is a PostgreSQL cluster of the test's own (tests/chaos/clusters.py) on the
bridge's address, set as docs/deploy.md asks of a server whose workers may be cut off
(`idle_in_transaction_session_timeout`, TCP keepalives); the workers' URL carries the
client's half (`connect_timeout`, keepalives, `tcp_user_timeout`).

`ROADIE_NETWORK_RUNS` sets the runs of the random-fault test (default 16);
`ROADIE_NETWORK_SECONDS` how long faults are injected at most (default 20: they stop
when the last run ends); `ROADIE_CHAOS_SEED` the seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from roadie.clock import SystemClock
from roadie.modules.sandbox import SandboxWorld
from roadie.states import CleanupStatus
from tests.chaos import clusters, hosts
from tests.chaos.clusters import Cluster
from tests.chaos.fleet import Fleet, all_settled, create_runs, require, runs_now
from tests.chaos.hosts import Host, Network
from tests.chaos.test_faults import _report
from tests.chaos.worlds import EffectsTally, assert_world_invariants, tally_effects, unfinished_at
from tests.remote.servers import SECRET, SandboxServer

RUNS = int(os.environ.get("ROADIE_NETWORK_RUNS", "16"))
FAULT_SECONDS = float(os.environ.get("ROADIE_NETWORK_SECONDS", "20"))
SEED = int(os.environ.get("ROADIE_CHAOS_SEED", str(random.randrange(1 << 30))))
CLAIM_TTL = 3
OBJECTS_PER_RUN = 10  # tests/chaos/fleet.py's event
# What docs/deploy.md asks of the server, so that a worker cut off mid-transaction holds
# its locks for seconds, not until TCP gives up (minutes), and a dead client is noticed.
SERVER_SETTINGS = {
    "idle_in_transaction_session_timeout": "'10s'",
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
    "max_connections": "200",
}
CLIENT_SETTINGS = "connect_timeout=3&keepalives_idle=5&keepalives_interval=2&keepalives_count=3&tcp_user_timeout=10000"


@dataclass
class Lan:
    """The network, its database and its world's server, and a folder per host."""

    network: Network
    database: Cluster
    world: SandboxServer
    home: Path

    @property
    def url(self) -> str:
        """The database as the hosts reach it (the test itself uses the same address)."""
        return f"postgresql://postgres@{self.network.gateway}:{self.database.port}/test?{CLIENT_SETTINGS}"

    def folder(self, name: str) -> Path:
        """A host's (or the operator's) working folder: its roadie.toml names the world's server."""
        folder = self.home / name
        folder.mkdir(exist_ok=True)
        (folder / "roadie.toml").write_text(
            f"[engine]\nclaim_ttl = {CLAIM_TTL}\npoll_interval = 0.2\n\n"
            f'[modules.sandbox]\nurl = "{self.world.url}"\nsecret = "{SECRET}"\n'
            "connect_timeout = 1.0\nread_timeout = 5.0\ncall_timeout = 8.0\n"
        )
        return folder

    def start_worker(self, fleet: Fleet, host: Host) -> None:
        fleet.start(cwd=self.folder(host.name), prefix=host.prefix, url=self.url)


@pytest.fixture
def lan(tmp_path: Path) -> Iterator[Lan]:
    require(hosts.missing() or clusters.missing())
    network = Network()
    database = Cluster("lan", listen=f"127.0.0.1,{network.gateway}").init(SERVER_SETTINGS).start()
    world = SandboxServer(tmp_path, host=network.gateway)
    try:
        database.sql("CREATE DATABASE test")
        yield Lan(network, database, world, tmp_path)
    finally:
        world.stop()
        network.close()
        database.remove()


def _check_exact(lan: Lan, ids: list[int], before: dict[str, object]) -> EffectsTally:
    """DESIGN §10 after the fact; answers the world's effects, tallied."""

    assert unfinished_at(lan.url, ids) == []
    ended = {(r.status, r.error) for r in asyncio.run(runs_now(lan.url, ids))}
    assert ended == {("succeeded", None)}, ended  # a network fault fails no run
    with SandboxWorld(str(lan.world.world), SystemClock()) as world:
        world.clear_faults()
        effects, after = world.effects(), world.snapshot()
    assert_world_invariants(effects, before, after)
    tally = tally_effects(effects)
    assert tally.created == len(ids) * OBJECTS_PER_RUN
    return tally


# What a revert's failure says when the world could not be reached (tests/remote's client).
UNREACHABLE = ("no answer within", "cannot connect", "no answer from", "the answer was lost")


def _retry_as_an_operator(lan: Lan, ids: list[int]) -> int:
    """DESIGN §5: a revert that fails leaves its row live and the run's cleanup
    `incomplete`, for a person to retry. A host cut off from the world mid-cleanup is such
    a failure; any other reason, or `incomplete` with nothing failed, is a bug. Each is
    retried as an operator would (`roadie cleanup RUN --again`), now that every link has
    healed; answers how many were."""
    runs = [r for r in asyncio.run(runs_now(lan.url, ids)) if r.cleanup_status == CleanupStatus.INCOMPLETE.value]
    for run in runs:
        report = run.cleanup_report or {}
        errors = [e["error"] for e in report.get("errors", [])]
        assert report.get("failed"), f"run {run.id}: cleanup incomplete with nothing failed: {report}"
        assert errors, f"run {run.id}: cleanup incomplete with no error named: {report}"
        assert all(any(w in e for w in UNREACHABLE) for e in errors), f"run {run.id}: {errors}"
        done = subprocess.run(
            [sys.executable, "-m", "roadie.cli.main", "cleanup", str(run.id), "--again", "--json"],
            cwd=lan.folder("operator"),
            env={**os.environ, "ROADIE_DATABASE_URL": lan.url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["status"] == "complete", done.stdout
    return len(runs)


def _late_refusals(fleet: Fleet) -> int:
    """Answers a worker came back with after its claims were taken over, refused."""
    return sum(p.read_text(errors="replace").count("claim lost") for p in fleet.home.glob("worker-*.log"))


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_a_worker_cut_off_from_the_database_has_its_claims_taken_over_and_its_late_answers_refused(
    lan: Lan,
) -> None:
    """Worker A has calls in the world's hands when its link to the database is cut (the
    world still answers it). Worker B, on another host, takes A's claims over once they
    expire and finishes every run. When A's link heals, the answers it held are refused:
    nothing it recorded late moves a step, and the world is exact."""
    a, b = lan.network.add(), lan.network.add()
    ids, before = asyncio.run(create_runs(lan.url, lan.world.world, 4))
    with SandboxWorld(str(lan.world.world), SystemClock()) as world:
        world.delay(1.0)  # long calls: the cut lands while A waits on the world
    lan.world.start()
    fleet = Fleet(lan.home, lan.url)
    try:
        lan.start_worker(fleet, a)

        def a_call_in_flight() -> bool:
            with SandboxWorld(str(lan.world.world), SystemClock()) as world:
                return any(d["ended"] is None for d in world.dispatches())

        fleet.wait_until("a call of A's in the world's hands", a_call_in_flight, 60)
        a.cut(port=lan.database.port)
        lan.start_worker(fleet, b)
        fleet.wait_until("B finished every run", lambda: all_settled(lan.url, ids), 120)
        a.heal()
        fleet.wait_until("A's late answers refused", lambda: _late_refusals(fleet) > 0, 90)
        codes = fleet.stop()
    finally:
        fleet.abort()
    assert codes == [0, 0], f"workers did not stop cleanly on SIGTERM: {codes}"
    _check_exact(lan, ids, before)


@pytest.mark.chaos
@pytest.mark.timeout(int(FAULT_SECONDS) + 300)
def test_workers_on_a_failing_network_lose_nothing_and_revert_nothing_twice(lan: Lan) -> None:
    """Three hosts, each with a worker, carry the runs while the test keeps cutting one
    off (from everything, or from the database alone), making links lossy or slow, and
    healing them; cuts last up to twice the claim's life, so claims are taken over. Then
    every link heals and the runs must end exact."""
    rng = random.Random(SEED)
    print(f"network chaos seed {SEED}, {RUNS} runs")
    machines = [lan.network.add() for _ in range(3)]
    ids, before = asyncio.run(create_runs(lan.url, lan.world.world, RUNS))
    lan.world.start()
    fleet = Fleet(lan.home, lan.url)
    faults: Counter[str] = Counter()
    try:
        for host in machines:
            lan.start_worker(fleet, host)
        # A worker that cannot open the database when it starts exits (69), for its
        # supervisor to start again (deploy/roadie-worker@.service): faults begin once all are up.
        fleet.wait_started()
        began = time.monotonic()
        heal_at: dict[str, float] = {}
        while time.monotonic() - began < FAULT_SECONDS:
            if all_settled(lan.url, ids):
                break  # faults after the last run ended would prove nothing
            now = time.monotonic()
            for host in machines:
                if host.name in heal_at and now >= heal_at[host.name]:
                    host.heal()
                    del heal_at[host.name]
            healthy = [h for h in machines if h.name not in heal_at]
            if len(healthy) > 1:  # one host always works
                host = rng.choice(healthy)
                fault = rng.choice(["cut", "cut from the database", "lossy", "slow"])
                if fault == "cut":
                    host.cut()
                elif fault == "cut from the database":
                    host.cut(port=lan.database.port)
                elif fault == "lossy":
                    host.lossy(rng.choice([10, 30]))
                else:
                    host.slow()
                faults[fault] += 1
                heal_at[host.name] = now + rng.uniform(0.5, 2.0 * CLAIM_TTL)
            time.sleep(rng.uniform(0.3, 1.5))
        faulty_seconds = time.monotonic() - began
        for host in machines:
            host.heal()
        fleet.wait_until("every run settled", lambda: all_settled(lan.url, ids), 240)
        codes = fleet.stop()
    finally:
        fleet.abort()
    assert codes == [0, 0, 0], f"workers did not stop cleanly on SIGTERM: {codes}"
    assert sum(faults.values()) >= 3, f"too few faults injected to prove anything: {dict(faults)}"
    retried = _retry_as_an_operator(lan, ids)
    tally = _check_exact(lan, ids, before)
    refused = _late_refusals(fleet)
    print(
        f"{dict(faults)}; {refused} late answers refused; {retried} cleanups retried by hand; "
        f"{tally.created} objects made, {tally.removed} removed"
    )
    _report(
        {
            "suite": "network",
            "runs": RUNS,
            "seed": SEED,
            "faults": dict(faults),
            "late_answers_refused": refused,
            "cleanups_retried_by_hand": retried,
            "objects": tally.created,
            "resources_lost": len(tally.never_removed),
            "removed_twice": len(tally.removed_twice),
            "seconds": round(faulty_seconds),
        }
    )

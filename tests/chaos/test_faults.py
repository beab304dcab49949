"""Faults from outside the engine: the database failing under it, a full disk, and a
module that delivers twice or loses its answers.

Each test ends the same way: the run finishes, its cleanup is complete, and the world is
what it was before the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from roadie.clock import SystemClock
from roadie.definitions import load_definition
from roadie.engine import Engine
from roadie.errors import StoreError
from roadie.modules.sandbox import SandboxWorld
from roadie.registry import build_registry
from roadie.states import RunStatus
from roadie.store import Store, dialects
from tests.chaos.worlds import assert_world_invariants, unfinished_at, unfinished_runs
from tests.conftest import Harness
from tests.databases import Database, is_pooled

HELD = """
id: held
cleanup: auto
phases:
  - name: only
    steps:
      - action: probe.make
        name: slow
        with: {hold: 30, answer: [{kind: thing, ref: slow}]}
        timeout: 2m
"""


def test_a_failed_claim_does_not_drop_the_dispatches_in_flight(harness: Harness) -> None:
    """The database fails a claim while a dispatch is in flight (a lost connection
    mid-commit): the dispatch still answers and is recorded in the same pass, instead of
    being cancelled after it wrote the world and left for its claim to expire."""
    in_flight = asyncio.Event()
    failed = asyncio.Event()

    def fail_a_claim_in_flight(name: str) -> None:
        # The first claim made while the dispatch is in flight fails, however many claims
        # a loaded machine made before the dispatch began.
        if name == "claim_steps" and in_flight.is_set() and not failed.is_set():
            failed.set()
            raise StoreError("claim_steps: the connection was lost while committing")

    async def answer_after_the_failed_claim(call: Any) -> None:
        in_flight.set()
        await failed.wait()

    async def body() -> None:
        run = await harness.start(HELD)
        harness.write_points.extra = fail_a_claim_in_flight
        harness.probe.observe = answer_after_the_failed_claim
        await harness.drive(harness.engine.tick())
        assert failed.is_set(), "a claim should have failed while the step was in flight"
        # (Once in a loaded full run there were two calls here; say which, and when.)
        assert len(harness.probe.calls) == 1, (harness.clock.now(), harness.probe.calls)
        [call] = harness.probe.calls
        assert call.outcome == "answered"
        step = await harness.step(run, "slow")
        assert step.status == "succeeded"
        harness.write_points.extra = None
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == ("succeeded", "complete")

    harness.run(body)


BORROW_ONCE = """\
id: borrow-once
title: A borrow with one attempt
cleanup: auto
phases:
  - name: storm
    steps:
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: yew, value: storm}
        retry: {attempts: 1}
"""


def test_a_borrow_whose_saved_value_the_database_lost_is_carried_out_again(harness: Harness) -> None:
    """Found by the failover test: the primary died while a borrow committed the value it
    was to give back, and the step failed for good (a `StoreError` was taken for the
    step's own failure), failing the run. Now it is tried again, even past the step's own
    attempts (here 1): the borrow is made to be carried out again, and the run succeeds
    and gives the weather back."""
    lost: list[str] = []

    def lose_the_first_save(name: str) -> None:
        if name == "save_lease_value" and not lost:
            lost.append(name)
            raise StoreError("save_lease_value: the connection was lost while committing")

    async def body() -> None:
        before = harness.world.snapshot()["regions"]["yew"]
        harness.write_points.extra = lose_the_first_save
        run = await harness.start(BORROW_ONCE)
        [run] = await harness.settle(run)
        assert lost, "the save should have failed once"
        assert (run.status, run.cleanup_status) == ("succeeded", "complete"), run.error
        step = await harness.step(run, "storm")
        assert step.attempts == 2
        assert harness.world.snapshot()["regions"]["yew"] == before

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


def _report(figures: dict[str, Any]) -> None:
    path = os.environ.get("ROADIE_CHAOS_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(figures) + "\n")


# -- the database server drops the engine's connections ---------------------------------------


UNKNOWN_THREAD = 1094  # MariaDB's answer to a KILL of a connection that has ended


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
            killed = 0
            for connection_id in ids:
                try:
                    await conn.execute(text(f"KILL {int(connection_id)}"))
                    killed += 1
                except DBAPIError as exc:
                    if exc.orig is None or exc.orig.args[0] != UNKNOWN_THREAD:
                        raise  # not a connection that ended between the listing and its KILL
            return killed
    finally:
        await engine.dispose()


def test_the_store_reconnects_after_the_server_drops_its_connections(harness: Harness) -> None:
    """Every pooled connection is killed by the server: the next read and the next write
    notice, open new connections, and succeed, instead of failing the caller."""
    if harness.database_url.startswith("sqlite"):
        pytest.skip("a file has no connections to drop")
    if is_pooled(harness.database_url):
        pytest.skip("behind PgBouncer the server's connections are the pooler's, which makes new ones itself")

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


# -- a module that delivers twice and loses answers --------------------------------------------

MANY = """
id: many
cleanup: auto
phases:
  - name: objects
    steps:
      - {action: sandbox.spawn, name: orcs, with: {kind: orc, region: yew, count: 4}, retry: {attempts: 10}}
      - {action: sandbox.place_item, name: chests, with: {kind: chest, region: yew, count: 3}, retry: {attempts: 10}}
      - {action: sandbox.broadcast, name: cry, with: {message: "to arms"}, retry: {attempts: 10}}
  - name: settings
    steps:
      - {action: core.lease, name: storm, with: {lease: sandbox.weather, target: yew, value: storm}}
      - {action: sandbox.spawn, name: trolls, with: {kind: troll, region: yew, count: 2}, retry: {attempts: 10}}
"""


@pytest.mark.chaos
def test_duplicate_deliveries_and_lost_answers_change_the_world_once(harness: Harness) -> None:
    """Every action call has a chance to be delivered twice, or to be applied with its
    answer lost (and the first two calls lose theirs for sure): the run succeeds, each
    object is made once and removed once, and the world ends as it began."""

    async def body() -> None:
        world = harness.world
        before = world.snapshot()
        world.lose_next(2)
        world.set_random_faults(duplicate=0.4, lose=0.3, seed=11)
        run = await harness.start(MANY)
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == ("succeeded", "complete")
        assert world.faults_met["duplicate"] >= 1, world.faults_met
        assert world.faults_met["lose"] >= 2, world.faults_met
        world.clear_faults()
        assert_world_invariants(world.effects(), before, world.snapshot())
        assert await unfinished_runs(harness.store, [run.id]) == []
        retried = [s.name for s in await harness.steps(run) if s.attempts > 1]
        assert retried, "a lost answer should have been retried under the same key"

    harness.run(body)


# -- the database server drops a worker's connections mid-run ----------------------------------

WORKER_EVENT = """
id: reconnect
params:
  region: {type: str}
cleanup: auto
phases:
  - name: muster
    steps:
      - {action: sandbox.spawn, name: orcs, with: {kind: orc, region: "{{ region }}", count: 3}, retry: {attempts: 30}}
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: "{{ region }}", value: storm}
        retry: {attempts: 30}
  - name: loot
    after: 1s
    steps:
      - action: sandbox.place_item
        name: gold
        with: {kind: gold, region: "{{ region }}", count: 2}
        retry: {attempts: 30}
"""
WORKER_RUNS = 6


async def _create_worker_runs(url: str, world_path: Path) -> tuple[list[int], dict[str, Any]]:
    clock = SystemClock()
    registry = build_registry({"sandbox": {"db": str(world_path)}}, clock=clock)
    world: SandboxWorld = registry.state("sandbox")
    for i in range(WORKER_RUNS):
        world.add_region(f"c{i}")
    world.delay(0.05)
    before = world.snapshot()
    store = await Store.open(url)
    try:
        engine = Engine(store, registry, clock=clock)
        definition = load_definition(WORKER_EVENT, "reconnect.yaml", registry)
        dumped = definition.model_dump(mode="json", by_alias=True)
        event = await store.create_event_version(definition.id, "", dumped, WORKER_EVENT, "test", clock.now())
        ids = [(await engine.start_run(event, {"region": f"c{i}"})).id for i in range(WORKER_RUNS)]
    finally:
        await store.close()
        await registry.close()
    return ids, before


def start_worker(url: str, home: Path, *, claim_ttl: float) -> tuple[subprocess.Popen[bytes], Path]:
    """A `roadie worker` process on `url` and the sandbox world in `home`, logging to
    `home/worker.log`."""
    (home / "roadie.toml").write_text(
        f'[engine]\nclaim_ttl = {claim_ttl:g}\npoll_interval = 0.2\n\n[modules.sandbox]\ndb = "world.db"\n'
    )
    log_path = home / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "roadie.cli.main", "--log-level", "info", "worker", "--concurrency", "8"],
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ROADIE_DATABASE_URL": url},
        )
    return worker, log_path


async def _settled(url: str, ids: list[int]) -> bool:
    store = await Store.open(url, migrate_schema=False)
    try:
        runs = await store.runs_by_ids(ids)
    finally:
        await store.close()
    return all(RunStatus(r.status).terminal and r.cleanup_status != "pending" for r in runs)


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_a_worker_carries_on_while_the_server_keeps_dropping_its_connections(
    database: Database, tmp_path: Path
) -> None:
    """A `roadie worker` process works six runs while every connection it holds is
    killed by the server every few tenths of a second (what a server restart does to
    it): it reconnects and carries on, every run succeeds and is cleaned up, the world
    ends as it began, and the worker stops cleanly."""
    if database.backend == "sqlite":
        pytest.skip("a file has no connections to drop")
    url = database.fresh(tmp_path)
    try:
        world_path = tmp_path / "world.db"
        ids, before = asyncio.run(_create_worker_runs(url, world_path))
        worker, log_path = start_worker(url, tmp_path, claim_ttl=5)
        rng = random.Random(5)
        killed = rounds = 0
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.1, 0.4))
                killed += asyncio.run(kill_connections(url))
                rounds += 1
                # Until the runs are done and a kill has landed on a connection in use (on a
                # fast machine the runs can end first: the idle worker's polls are hit next).
                if rounds % 4 == 0 and "reconnecting" in log_path.read_text() and asyncio.run(_settled(url, ids)):
                    break
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        output = log_path.read_text()
        assert code == 0, output[-3000:]
        assert killed > 0
        assert "reconnecting" in output, "the server never dropped a connection in use"

        assert unfinished_at(url, ids) == []
        with SandboxWorld(str(world_path), SystemClock()) as world:
            world.clear_faults()
            assert_world_invariants(world.effects(), before, world.snapshot())
        print(f"{database.backend}: {killed} connections killed in {rounds} rounds")
        _report({"suite": "reconnect", "backend": database.backend, "runs": len(ids), "killed": killed})
    finally:
        database.drop_all()


# -- the disk fills up under SQLite -------------------------------------------------------------

FILLING = """
id: filling
cleanup: auto
phases:
  - name: horde
    steps:
""" + "".join(
    f"      - {{action: sandbox.spawn, name: horde{i}, with: {{kind: orc, region: britain, count: 100}}}}\n"
    for i in range(4)
)


class Disk:
    """Where the database lives, and a way to run it out of space and give space back."""

    def __init__(self, how: str, root: Path) -> None:
        self.how = how
        self.root = root / "disk"
        self.root.mkdir()
        self.ballast = self.root / "ballast"
        self.limit: int | None = None  # max_page_count, for the "pages" disk
        self.mounted = False
        if how == "tmpfs":
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(self.root)], check=False)
            if done.returncode != 0:
                pytest.skip("cannot mount a tmpfs here (needs root)")
            self.mounted = True

    @property
    def url(self) -> str:
        return f"sqlite:///{self.root / 'roadie.db'}"

    def watch(self, store: Store) -> None:
        """Apply the page limit to every new connection of `store`."""

        def limit(dbapi_connection: Any, _record: Any) -> None:
            if self.limit is not None:
                dbapi_connection.execute(f"PRAGMA max_page_count = {int(self.limit)}")

        sa_event.listen(store.engine.sync_engine, "connect", limit)

    async def fill(self, store: Store, world: SandboxWorld) -> None:
        """Run out of space. At the page limit the database has room for the claims and
        not for the records; on the tmpfs every free byte is taken the moment the world
        has made the first objects (after the claims, before anything is recorded)."""
        if self.how == "tmpfs":

            def full(op: str, when: str) -> None:
                if (op, when) == ("spawn", "after") and not self.ballast.exists():
                    stat = os.statvfs(self.root)
                    with self.ballast.open("wb") as out:
                        out.write(b"\0" * (stat.f_bavail * stat.f_frsize))

            world.hook = full
            return
        async with store.engine.connect() as conn:
            pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar()
        self.limit = int(pages or 0) + 12  # 48 KiB: the claims fit, 400 records do not
        await store.engine.dispose()  # new connections meet the limit

    async def free(self, store: Store, world: SandboxWorld) -> None:
        world.hook = None
        self.ballast.unlink(missing_ok=True)
        self.limit = None
        await store.engine.dispose()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


@pytest.mark.chaos
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["pages", "tmpfs"])
def test_a_full_disk_fails_clearly_corrupts_nothing_and_the_run_finishes_after(tmp_path: Path, how: str) -> None:
    """SQLite runs out of space while recording 400 creatures the world has made (on a
    tmpfs filled to the brim, or at `PRAGMA max_page_count`): the engine gives up with a
    clear error, the database passes its integrity check with every placeholder in
    place, and once space returns the same run finishes and is cleaned up completely."""
    disk = Disk(how, tmp_path)
    harness = Harness(tmp_path, (), database_url=disk.url)

    async def body() -> None:
        disk.watch(harness.store)
        before = harness.world.snapshot()
        run = await harness.start(FILLING)
        await disk.fill(harness.store, harness.world)
        with pytest.raises(StoreError) as failure:
            await harness.settle(run)
        assert "database or disk is full" in failure.value.message, failure.value.message
        with sqlite3.connect(disk.root / "roadie.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert len(harness.world.snapshot()["creatures"]) == 400, "the world should have been written"
        states = {(r.kind, r.state) for r in await harness.resources(run)}
        assert states == {("@step", "pending")}, "every dispatch keeps its placeholder"
        await disk.free(harness.store, harness.world)
        [run] = await harness.settle(run)
        assert (run.status, run.cleanup_status) == ("succeeded", "complete")
        assert_world_invariants(harness.world.effects(), before, harness.world.snapshot())
        assert await unfinished_runs(harness.store, [run.id]) == []

    try:
        harness.run(body)
    finally:
        asyncio.run(harness.registry.close())
        disk.close()

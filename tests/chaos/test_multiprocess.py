"""Four worker processes on one database, killed with SIGKILL at random and restarted.

What this proves, for each database the suite runs on: every run reaches a terminal
state and a complete cleanup; the sandbox's effect log shows each object of each step
made exactly once and removed exactly once (the key ledger makes retries exact); no
step was in two workers' hands at once (the sandbox's dispatch log, with a killed
process's open call ending at its kill time); and the world ends equal to its start.

The event has three phases: objects, a lease on a region's weather that expires by
itself mid-run (so the expiry sweeper of several workers contends for it) with more
objects, and, after a delay, a last batch. Each run has a region of its own, so
concurrent runs never hold one lease target.

`ROADIE_CHAOS_RUNS` sets the number of runs (default 50); `ROADIE_CHAOS_SEED` the seed
of the kills.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from roadie.clock import SystemClock
from roadie.definitions import load_definition
from roadie.engine import Engine, EngineOptions
from roadie.modules.sandbox import SandboxWorld
from roadie.registry import build_registry
from roadie.states import CleanupStatus, RunStatus
from roadie.store import Store
from roadie.store.rows import RunRow
from tests.databases import Database

RUNS = int(os.environ.get("ROADIE_CHAOS_RUNS", "50"))
SEED = int(os.environ.get("ROADIE_CHAOS_SEED", str(random.randrange(1 << 30))))
WORKERS = 4
CLAIM_TTL = 3.0
CHAOS_SECONDS = 25.0  # workers are killed during this long, then left to finish
DEADLINE = 150.0 + RUNS * 1.0

EVENT = """\
id: chaos
title: Chaos raid
params:
  region: {type: str}
cleanup: auto
phases:
  - name: muster
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: "{{ region }}", count: 3}
        retry: {attempts: 20, backoff: 100ms}
      - action: sandbox.place_item
        name: chests
        with: {kind: chest, region: "{{ region }}", count: 2}
        retry: {attempts: 20, backoff: 100ms}
  - name: storm
    steps:
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: "{{ region }}", value: storm, for: 1s}
        retry: {attempts: 20, backoff: 100ms}
      - action: sandbox.spawn
        name: trolls
        with: {kind: troll, region: "{{ region }}", count: 2}
        retry: {attempts: 20, backoff: 100ms}
  - name: loot
    after: 1s
    steps:
      - action: sandbox.place_item
        name: gold
        with: {kind: gold, region: "{{ region }}", count: 3}
        retry: {attempts: 20, backoff: 100ms}
      - action: sandbox.broadcast
        name: cry
        with: {message: "Loot in {{ region }}", region: "{{ region }}"}
        retry: {attempts: 20, backoff: 100ms}
"""


@dataclass
class Fleet:
    """The worker processes: started, killed (with the time each died), stopped."""

    home: Path
    url: str
    alive: list[subprocess.Popen[bytes]] = field(default_factory=list)
    killed: dict[int, float] = field(default_factory=dict)  # pid -> when it was dead for sure
    started: int = 0
    logs: dict[int, int] = field(default_factory=dict)  # pid -> the number in its log's name

    def start(self) -> None:
        self.started += 1
        log = (self.home / f"worker-{self.started}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "roadie.cli.main", "--log-level", "info", "worker", "--concurrency", "8"],
            cwd=self.home,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ROADIE_DATABASE_URL": self.url},
        )
        log.close()
        self.logs[proc.pid] = self.started
        self.alive.append(proc)

    def kill(self, rng: random.Random) -> None:
        proc = self.alive.pop(rng.randrange(len(self.alive)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.killed[proc.pid] = time.time()  # it executed nothing after this moment

    def stop(self) -> list[int]:
        """SIGTERM every live worker once it is up (a worker started a moment ago may still
        be importing, before it has a handler for the signal); their exit codes."""
        deadline = time.monotonic() + 60
        for proc in self.alive:
            log = self.home / f"worker-{self.logs[proc.pid]}.log"
            while proc.poll() is None and time.monotonic() < deadline and b"worker started" not in log.read_bytes():
                time.sleep(0.05)
        for proc in self.alive:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in self.alive]
        self.alive.clear()
        return codes

    def abort(self) -> None:
        for proc in self.alive:
            proc.kill()
            proc.wait(timeout=30)
        self.alive.clear()


def _settled(run: RunRow) -> bool:
    return RunStatus(run.status).terminal and run.cleanup_status in (
        CleanupStatus.COMPLETE.value,
        CleanupStatus.INCOMPLETE.value,
        CleanupStatus.NOT_REQUIRED.value,
    )


async def _create_runs(url: str, world_path: Path, n: int) -> tuple[list[int], dict[str, Any]]:
    """Open new regions, take the world's snapshot, and create `n` runs, one region each."""
    clock = SystemClock()
    registry = build_registry({"sandbox": {"db": str(world_path)}}, clock=clock)
    world: SandboxWorld = registry.state("sandbox")
    for i in range(n):
        world.add_region(f"chaos{i}")
    world.delay(0.15)  # every call takes a while, so kills land inside calls
    world.enable_dispatch_log()
    before = world.snapshot()
    store = await Store.open(url)
    try:
        engine = Engine(store, registry, clock=clock, options=EngineOptions())
        definition = load_definition(EVENT, "chaos.yaml", registry)
        dumped = definition.model_dump(mode="json", by_alias=True)
        event = await store.create_event_version(definition.id, definition.title, dumped, EVENT, "test", clock.now())
        ids = [(await engine.start_run(event, {"region": f"chaos{i}"})).id for i in range(n)]
    finally:
        await store.close()
        await registry.close()
    return ids, before


async def _runs(url: str, ids: list[int]) -> list[RunRow]:
    store = await Store.open(url, migrate_schema=False)
    try:
        return await store.runs_by_ids(ids)
    finally:
        await store.close()


async def _steps_by_key(url: str, ids: list[int]) -> dict[str, Any]:
    store = await Store.open(url, migrate_schema=False)
    try:
        return {s.idempotency_key: s for run_id in ids for s in await store.list_steps(run_id)}
    finally:
        await store.close()


def _overlaps(dispatches: list[dict[str, Any]], killed: dict[int, float]) -> list[str]:
    """Pairs of calls of one key whose intervals overlap; an open call ends at its
    process's kill time (a call left open by a process that was not killed is a bug)."""
    problems = []
    by_key: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for d in dispatches:
        ended = d["ended"]
        if ended is None:
            if d["pid"] not in killed:
                problems.append(f"{d['key']}: call in pid {d['pid']} never ended, and that process was not killed")
                continue
            ended = killed[d["pid"]]
        by_key[d["key"]].append((d["started"], ended, d["pid"]))
    for key, calls in by_key.items():
        calls.sort()
        for (_s1, e1, p1), (s2, _e2, p2) in itertools.pairwise(calls):
            if s2 < e1:
                problems.append(f"{key}: pid {p1} until {e1:.3f} and pid {p2} from {s2:.3f}")
    return problems


@pytest.mark.slow
@pytest.mark.timeout(int(DEADLINE) + 120)
def test_killed_workers_lose_nothing_and_no_step_runs_twice_at_once(database: Database, tmp_path: Path) -> None:
    """4 workers, killed with SIGKILL at random moments and replaced, carry 50 runs of a
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
    ids, before = asyncio.run(_create_runs(url, world_path, RUNS))
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
            runs = asyncio.run(_runs(url, ids))
            if all(_settled(r) for r in runs) and now - began >= CHAOS_SECONDS:
                break
            time.sleep(0.25)
        codes = fleet.stop()
    finally:
        fleet.abort()
    unsettled = [(r.id, r.status, r.cleanup_status) for r in runs if not _settled(r)]
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
    world_steps = {k: s for k, s in asyncio.run(_steps_by_key(url, ids)).items() if s.action != "core.lease"}
    assert set(world_steps) <= set(ledger)

    problems = _overlaps(dispatches, fleet.killed)
    assert not problems, problems[:10]
    retried = sum(1 for s in world_steps.values() if s.attempts > 1)
    kills, calls = len(fleet.killed), len(dispatches)
    print(f"{kills} kills, {fleet.started} workers started, {retried} steps retried, {calls} calls")

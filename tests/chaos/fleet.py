"""Worker processes on one database, and the runs they carry: what the multi-process
chaos tests share (tests/chaos/test_multiprocess.py, test_network.py, test_failover.py).

The event has three phases: objects, a lease on a region's weather that expires by
itself mid-run (so the expiry sweeper of several workers contends for it) with more
objects, and, after a delay, a last batch. Each run has a region of its own, so
concurrent runs never hold one lease target.
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
from collections import defaultdict
from collections.abc import Callable, Sequence
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

Popen = subprocess.Popen[bytes]

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
    alive: list[Popen] = field(default_factory=list)
    killed: dict[int, float] = field(default_factory=dict)  # pid -> when it was dead for sure
    started: int = 0
    logs: dict[int, int] = field(default_factory=dict)  # pid -> the number in its log's name

    def start(self, *, cwd: Path | None = None, prefix: Sequence[str] = (), url: str | None = None) -> Popen:
        """A `roadie worker` in `cwd` (its `roadie.toml`; default: the fleet's home), its
        command run through `prefix` (`ip netns exec HOST`), on `url` (default: the
        fleet's)."""
        self.started += 1
        log = self.log_of(self.started).open("wb")
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "roadie.cli.main", "--log-level", "info", "worker", "--concurrency", "8"],
            cwd=cwd or self.home,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ROADIE_DATABASE_URL": url or self.url},
        )
        log.close()
        self.logs[proc.pid] = self.started
        self.alive.append(proc)
        return proc

    def log_of(self, number: int) -> Path:
        return self.home / f"worker-{number}.log"

    def kill(self, rng: random.Random) -> None:
        proc = self.alive.pop(rng.randrange(len(self.alive)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.killed[proc.pid] = time.time()  # it executed nothing after this moment

    def wait_started(self, timeout: float = 60) -> None:
        """Until every live worker is up (its database opened, its handlers in place), has
        exited, or `timeout` has passed."""
        deadline = time.monotonic() + timeout
        for proc in self.alive:
            log = self.log_of(self.logs[proc.pid])
            while proc.poll() is None and time.monotonic() < deadline and b"worker started" not in log.read_bytes():
                time.sleep(0.05)

    def wait_until(self, what: str, check: Callable[[], bool], seconds: float) -> None:
        """Until `check()` holds; past `seconds`, fail saying `what` was awaited, with the
        end of every worker's log."""
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(self.home.glob("worker-*.log")))
                raise AssertionError(f"{what} within {seconds:.0f}s\n{logs}")
            time.sleep(0.1)

    def stop(self) -> list[int]:
        """SIGTERM every live worker once it is up (a worker started a moment ago may still
        be importing, before it has a handler for the signal); their exit codes."""
        self.wait_started()
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


def settled(run: RunRow) -> bool:
    return RunStatus(run.status).terminal and run.cleanup_status in (
        CleanupStatus.COMPLETE.value,
        CleanupStatus.INCOMPLETE.value,
        CleanupStatus.NOT_REQUIRED.value,
    )


async def create_runs(url: str, world_path: Path, n: int) -> tuple[list[int], dict[str, Any]]:
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


def all_settled(url: str, ids: list[int]) -> bool:
    """Whether every one of these runs has ended and been cleaned up, now."""
    return all(settled(r) for r in asyncio.run(runs_now(url, ids)))


async def runs_now(url: str, ids: list[int]) -> list[RunRow]:
    store = await Store.open(url, migrate_schema=False)
    try:
        return await store.runs_by_ids(ids)
    finally:
        await store.close()


async def steps_by_key(url: str, ids: list[int]) -> dict[str, Any]:
    store = await Store.open(url, migrate_schema=False)
    try:
        return {s.idempotency_key: s for run_id in ids for s in await store.list_steps(run_id)}
    finally:
        await store.close()


def overlaps(dispatches: list[dict[str, Any]], killed: dict[int, float]) -> list[str]:
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


def require(problem: str | None) -> None:
    """Go on when `problem` is None; else skip, or fail in CI (`CI=true`), where a skip
    would hide a part the machine should have."""
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)

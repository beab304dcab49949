"""An engine in a process of its own, which SIGKILLs itself at a chosen write point.

The kill-point tests start this in a real child process: it opens the database and the
sandbox world file, and either starts a run and works it (a `start` process, armed to
die) or carries on with every run it finds unfinished (a `recover` process, as a worker
restarted after the crash would).

The point is named `NAME` or `NAME#K` (the K-th time it is met in this process):

- a store write point (`claim_steps`, `record_outcomes`, `mark_reverted`...), met just
  before that transaction commits;
- `world:OP:before` / `world:OP:after`, met just before the world's operation `OP`
  (`spawn`, `weather.write`, `remove_many`, `revert_key`...) begins and just after it
  committed.

At that moment the process sends itself SIGKILL: no `finally`, no flush, no rollback but
the database's own. Children are forked from a server that has imported the engine
already (`context()`), so a trial costs a fork, not an interpreter start.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.context import BaseContext

from roadie.clock import FakeClock
from roadie.definitions import load_definition
from roadie.engine import Engine, EngineOptions
from roadie.modules.sandbox import SandboxWorld
from roadie.registry import build_registry
from roadie.states import CleanupStatus, RunStatus
from roadie.store import Store

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
NOT_REACHED = 3  # the exit code of an armed process that finished without meeting its point

EVENT = """\
id: kill
title: Killed at every write
duration: 20s
cleanup: auto
params:
  region: {type: str}
  orcs: {type: int, default: 3}
  wolves: {type: int, default: 2}
  gold: {type: int, default: 2}
phases:
  - name: muster
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: "{{ region }}", count: "{{ orcs }}"}
        retry: {attempts: 10, backoff: 1s}
      - action: sandbox.spawn
        name: wolves
        with: {kind: wolf, region: "{{ region }}", count: "{{ wolves }}"}
        retry: {attempts: 10, backoff: 1s}
  - name: storm
    steps:
      - action: core.lease
        name: storm
        with: {lease: sandbox.weather, target: "{{ region }}", value: storm}
        retry: {attempts: 10, backoff: 1s}
      - action: core.lease
        name: double xp
        with: {lease: sandbox.xp_rate, value: 2.0, for: 5s}
        retry: {attempts: 10, backoff: 1s}
      - action: core.lease
        name: banner
        with: {lease: sandbox.motd, value: "storm over {{ region }}", priority: 3}
        retry: {attempts: 10, backoff: 1s}
  - name: loot
    after: 10s
    steps:
      # Armed by the test to lose its answer on its only attempt: the placeholder stays
      # pending, and cleanup reverts by the key alone.
      - action: sandbox.place_item
        name: gold
        with: {kind: gold, region: "{{ region }}", count: "{{ gold }}"}
        retry: {attempts: 1}
        on_error: continue
"""


@dataclass(frozen=True)
class Orders:
    """What one engine process is to do."""

    url: str
    world: str
    log: str
    clock_days: int  # the process's FakeClock starts this many days after EPOCH
    kill_at: str | None = None  # NAME or NAME#K; None: a process that lives
    region: str | None = None  # set: start a run in this region; None: recover
    counts: tuple[int, int, int] = (3, 2, 2)  # orcs, wolves, gold
    concurrency: int = 32


class Killer:
    """Counts the points this process meets and dies at the armed one."""

    def __init__(self, kill_at: str | None) -> None:
        name, _, k = (kill_at or "").partition("#")
        self.name = name or None
        self.occurrence = int(k or 1)
        self.seen: Counter[str] = Counter()

    def __call__(self, point: str) -> None:
        self.seen[point] += 1
        if point == self.name and self.seen[point] == self.occurrence:
            os.kill(os.getpid(), signal.SIGKILL)


def main(orders: Orders) -> None:
    """The child process's body (a `multiprocessing` target)."""
    log = os.open(orders.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    print(f"pid {os.getpid()}: {orders}", flush=True)
    asyncio.run(_work(orders))
    if orders.kill_at is not None:
        print(f"pid {os.getpid()}: never met {orders.kill_at}", flush=True)
        os._exit(NOT_REACHED)


async def _work(orders: Orders) -> None:
    clock = FakeClock(EPOCH + timedelta(days=orders.clock_days))
    killer = Killer(orders.kill_at)
    registry = build_registry({"sandbox": {"db": orders.world}}, clock=clock)
    world: SandboxWorld = registry.state("sandbox")
    world.hook = lambda op, when: killer(f"world:{op}:{when}")
    store = await Store.open(orders.url, migrate_schema=False)
    store.write_point = killer
    engine = Engine(
        store,
        registry,
        clock=clock,
        worker_id=f"pid-{os.getpid()}",
        options=EngineOptions(concurrency=orders.concurrency, seed=orders.clock_days),
    )
    try:
        if orders.region is not None:
            definition = load_definition(EVENT, "kill.yaml", registry)
            dumped = definition.model_dump(mode="json", by_alias=True)
            event = await store.create_event_version(
                definition.id, definition.title, dumped, EVENT, "test", clock.now()
            )
            orcs, wolves, gold = orders.counts
            params = {"region": orders.region, "orcs": orcs, "wolves": wolves, "gold": gold}
            ids = [(await engine.start_run(event, params)).id]
        else:
            ids = [r.id for r in await store.list_runs(limit=100_000) if not _done(r.status, r.cleanup_status)]
        if ids:
            await engine.settle(ids, max_ticks=10_000)
    finally:
        await store.close()
        await registry.close()


def _done(status: str, cleanup_status: str) -> bool:
    return RunStatus(status).terminal and cleanup_status != CleanupStatus.PENDING.value


_context: BaseContext | None = None


def context() -> BaseContext:
    """The forkserver context, its server preloaded with this module (and so the engine)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        _context = ctx
    return _context

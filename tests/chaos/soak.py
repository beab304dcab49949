"""The soak: thousands of runs under random faults, counting what happened.

Runs go in batches of a few at once on one database and one world file (each run of a
batch has a region of its own; the world's xp rate is one target they all contend for).
The sandbox throws random faults at every call — failures, lost answers, half-applied
crashes, duplicate deliveries, failing reverts — and the engine's process "dies" at a
random write of some batches (the write is aborted, the engine abandoned, a fresh one
started later on the clock). A cleanup left `incomplete` by failing reverts is retried
by a human once the faults are off. After each batch the world must equal its state
before the batch, and the ledger must hold nothing live: a leaked object, an unrestored
setting or a live row is a resource lost.

    .venv/bin/python -m tests.chaos.soak --runs 2000 [--database-url URL] [--seed N] [--json FILE]

`tests/chaos/test_soak.py` runs it at `--soak-runs` size (default 20) in the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from roadie.clock import FakeClock
from roadie.definitions import EventDefinition
from roadie.engine import Engine, EngineOptions
from roadie.modules.sandbox import SandboxWorld
from roadie.modules.sandbox.world import SEED_REGIONS
from roadie.registry import Registry, build_registry
from roadie.states import CleanupStatus
from roadie.store import Store
from tests.chaos.worlds import tally_effects, unfinished_runs

BATCH = 4
CLAIM_TTL = 60.0
RESTART_AFTER = CLAIM_TTL * 5 + 1  # past every claim of the dead engine, its cleanup's included
FAULTS = {"fail": 0.08, "lose": 0.08, "crash": 0.05, "duplicate": 0.05, "revert_fail": 0.05}
CRASHED_BATCHES = 0.3  # the share of batches whose engine process dies once


class EngineDied(BaseException):
    """The engine's process died at a write (a BaseException, as a signal would be: no
    `except Exception` in the engine may swallow it)."""


@dataclass
class SoakReport:
    runs: int = 0
    batches: int = 0
    seed: int = 0
    backend: str = "sqlite"
    seconds: float = 0.0
    worlds_restored: int = 0  # batches whose world ended equal to its start
    resources_lost: int = 0  # leaked objects + unrestored settings + rows left live
    objects_made: int = 0
    objects_removed_twice: int = 0
    run_status: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)  # injected, by kind
    engine_crashes: dict[str, int] = field(default_factory=dict)  # by write point
    human_retries: int = 0  # cleanups a human ran again after `incomplete`
    problems: list[str] = field(default_factory=list)


class Crashes:
    """The store's write point: kills the engine at its `at`-th write, once armed; after
    that, the dead engine commits nothing."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.writes = 0
        self.died_at: str | None = None

    def arm(self, at: int | None) -> None:
        self.at, self.writes, self.died_at = at, 0, None

    def __call__(self, point: str) -> None:
        if self.died_at is not None:
            raise EngineDied(f"dead since {self.died_at}")
        self.writes += 1
        if self.at is not None and self.writes == self.at:
            self.died_at = point
            raise EngineDied(point)


class Soak:
    def __init__(self, url: str, world_path: str, seed: int) -> None:
        self.url = url
        self.world_path = world_path
        self.rng = random.Random(seed)
        self.seed = seed
        self.clock = FakeClock()
        self.crashes = Crashes()
        self.generation = 0
        self.faults: Counter[str] = Counter()
        self.registry: Registry
        self.store: Store
        self.engine: Engine

    @property
    def world(self) -> SandboxWorld:
        world: SandboxWorld = self.registry.state("sandbox")
        return world

    async def boot(self) -> None:
        self.registry = build_registry({"sandbox": {"db": self.world_path}}, clock=self.clock)
        self.store = await Store.open(self.url)
        self.store.write_point = self.crashes
        self.engine = Engine(
            self.store,
            self.registry,
            clock=self.clock,
            worker_id=f"soak-{self.generation}",
            options=EngineOptions(claim_ttl=CLAIM_TTL, seed=self.generation),
        )

    async def shutdown(self) -> None:
        self.faults.update(self.world.faults_met)
        await self.store.close()
        await self.registry.close()

    async def restart(self) -> None:
        """The dead engine's tasks stop, its files are reopened by a fresh one, later."""
        ours = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and _is_roadie_task(t)]
        for task in ours:
            task.cancel()
        if ours:
            await asyncio.wait(ours, timeout=30)
        await self.shutdown()  # the dead store keeps its fired Crashes: it commits nothing more
        self.crashes = Crashes()
        self.generation += 1
        self.clock.advance(RESTART_AFTER)
        await self.boot()
        self.world.set_random_faults(**FAULTS, seed=self.rng.randrange(1 << 30))

    # -- one batch --------------------------------------------------------------------

    def _event(self, index: int) -> dict[str, Any]:
        region = SEED_REGIONS[index % len(SEED_REGIONS)]
        rng = self.rng
        choices = [
            lambda: {"action": "sandbox.spawn", "with": {"kind": "orc", "region": region, "count": rng.randint(1, 4)}},
            lambda: {
                "action": "sandbox.place_item",
                "with": {"kind": "gold", "region": region, "count": rng.randint(1, 3)},
            },
            lambda: {"action": "sandbox.broadcast", "with": {"message": "hear ye", "region": region}},
            lambda: {"action": "sandbox.buff", "with": {"name": "haste", "region": region, "duration": 30}},
            lambda: {"action": "core.lease", "with": {"lease": "sandbox.weather", "target": region, "value": "storm"}},
            lambda: {"action": "core.lease", "with": {"lease": "sandbox.xp_rate", "value": 2.0, "for": "5s"}},
        ]
        phases = []
        for p in range(rng.randint(1, 3)):
            steps = []
            for _ in range(rng.randint(1, 3)):
                step = rng.choice(choices)()
                step["retry"] = {"attempts": rng.randint(1, 5), "backoff": "200ms"}
                step["on_error"] = rng.choice(["fail", "continue"])
                steps.append(step)
            phases.append({"name": f"phase {p}", "after": rng.choice([0, 0, 2]), "steps": steps})
        return {"id": f"soak-{index}", "cleanup": "auto", "duration": rng.choice([0, 10]), "phases": phases}

    async def batch(self, size: int, report: SoakReport) -> None:
        self.world.clear_faults()
        self.clock.advance(86_400)  # every buff of the batch before has run out
        before = self.world.snapshot()
        effects_before = len(self.world.effects())
        self.world.set_random_faults(**FAULTS, seed=self.rng.randrange(1 << 30))
        ids = []
        for i in range(size):
            model = EventDefinition.model_validate(self._event(i))
            dumped = model.model_dump(mode="json", by_alias=True)
            event = await self.store.create_event_version(model.id, "", dumped, "", "soak", self.clock.now())
            ids.append((await self.engine.start_run(event, {})).id)
        self.crashes.arm(self.rng.randint(1, 60) if self.rng.random() < CRASHED_BATCHES else None)
        while True:
            try:
                await self._finish(ids, report)
                break
            except EngineDied:
                report.engine_crashes[self.crashes.died_at or "?"] = (
                    report.engine_crashes.get(self.crashes.died_at or "?", 0) + 1
                )
                await self.restart()
        self.world.clear_faults()
        self.clock.advance(86_400)
        after = self.world.snapshot()
        report.batches += 1
        report.runs += size
        for run_id in ids:
            run = await self.store.get_run(run_id)
            key = f"{run.status}/{run.cleanup_status}"
            report.run_status[key] = report.run_status.get(key, 0) + 1
        lost = _lost(before, after)
        problems = await unfinished_runs(self.store, ids)
        tally = tally_effects(self.world.effects()[effects_before:])
        report.objects_made += tally.created
        report.objects_removed_twice += len(tally.removed_twice)
        report.resources_lost += lost + sum(1 for p in problems if "not final" in p)
        if after == before:
            report.worlds_restored += 1
        if problems or after != before or tally.removed_twice or tally.made_twice:
            report.problems.append(f"batch {report.batches} (runs {ids}): {problems} lost={lost}")

    async def _finish(self, ids: list[int], report: SoakReport) -> None:
        """The runs to their end and their cleanups complete, as worker and humans would."""
        await self.engine.settle(ids, max_ticks=5000)
        self.crashes.arm(None)
        for run_id in ids:
            if (await self.store.get_run(run_id)).cleanup_status == CleanupStatus.INCOMPLETE:
                # The faults are still on: a human waits for the module to be fixed first.
                self.faults.update(self.world.faults_met)
                self.world.faults_met.clear()
                self.world.clear_faults()
                await self.engine.clean_up(run_id, actor="operator", again=True)
                report.human_retries += 1


def _lost(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Objects left over, settings and weathers not given back, buffs still on."""
    lost = len(set(after["creatures"]) - set(before["creatures"])) + len(set(after["items"]) - set(before["items"]))
    lost += sum(1 for k, v in before["regions"].items() if after["regions"].get(k) != v)
    lost += sum(1 for k, v in before["settings"].items() if after["settings"].get(k) != v)
    return lost + len(after["buffs"])


def _is_roadie_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and f"{os.sep}roadie{os.sep}" in code.co_filename


async def soak(url: str, world_path: str, runs: int, seed: int, backend: str = "sqlite") -> SoakReport:
    report = SoakReport(seed=seed, backend=backend)
    started = time.monotonic()
    s = Soak(url, world_path, seed)
    await s.boot()
    try:
        while report.runs < runs:
            await s.batch(min(BATCH, runs - report.runs), report)
    finally:
        await s.shutdown()
    report.faults = dict(sorted(s.faults.items()))
    report.seconds = round(time.monotonic() - started, 1)
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Roadie's random-fault soak")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--json", help="append the report as one JSON line to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/roadie.db"
        backend = url.split(":", 1)[0]
        report = asyncio.run(soak(url, os.path.join(tmp, "world.db"), args.runs, args.seed, backend))
    figures = asdict(report)
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps({"suite": "soak", **figures}) + "\n")
    return 0 if not report.problems and not report.resources_lost else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

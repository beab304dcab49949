"""Step throughput of one worker on SQLite, per reversible class, side by side in one run.

Shapes: one run of N steps in one phase, and R runs of 5 steps. The module is an
in-process no-op, so what is measured is the engine and its database, not a world.
Results are medians of several repetitions with min and max; because these machines are
shared and noisy, compare the ratios between rows of one run, not seconds across runs.

    .venv/bin/python benchmarks/throughput.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/throughput.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from report import LoadReport, parse_args, progress, write_section

from roadie.clock import FakeClock
from roadie.definitions import EventDefinition
from roadie.engine import Engine, EngineOptions
from roadie.modules import core
from roadie.registry import Call, Module, Registry, RevertCall
from roadie.registry.module import NoParams
from roadie.runtime import freeze_heap
from roadie.states import Reversible
from roadie.store import Store
from roadie.store.rows import EventRow

bench = Module("bench")


@bench.action("none", reversible=Reversible.NONE, params=NoParams)
def noop(call: Call[NoParams]) -> None:
    return None


@bench.action("ledger", reversible=Reversible.LEDGER, params=NoParams)
def ledgered(call: Call[NoParams]) -> list[dict[str, Any]]:
    return [{"kind": "thing", "ref": call.idempotency_key}]


@ledgered.revert
def unledger(call: RevertCall) -> None:
    return None


def _event(action: str, n: int) -> dict[str, Any]:
    steps = [{"action": f"bench.{action}"} for _ in range(n)]
    return {"id": f"bench-{action}", "cleanup": "manual", "phases": [{"name": "all", "steps": steps}]}


async def open_bench(url: str, action: str, steps: int, concurrency: int) -> tuple[Store, Engine, EventRow]:
    """A store on `url`, one engine with core and the no-op module, and an event of `steps`
    `bench.ACTION` steps in one phase (cleanup manual, so only the drain is measured)."""
    clock = FakeClock()
    registry = Registry(clock)
    registry.register(core.module)
    registry.register(bench)
    store = await Store.open(url)
    engine = Engine(store, registry, clock=clock, options=EngineOptions(concurrency=concurrency))
    definition = EventDefinition.model_validate(_event(action, steps))
    event = await store.create_event_version(
        definition.id, "", definition.model_dump(mode="json", by_alias=True), "", "bench", clock.now()
    )
    return store, engine, event


async def _measure(action: str, runs: int, steps_per_run: int, concurrency: int) -> float:
    """Seconds for one worker to drain `runs` runs of `steps_per_run` steps."""
    with tempfile.TemporaryDirectory() as tmp:
        store, engine, event = await open_bench(f"sqlite:///{tmp}/bench.db", action, steps_per_run, concurrency)
        try:
            ids = [(await engine.start_run(event, {})).id for _ in range(runs)]
            started = time.perf_counter()
            await engine.settle(ids)
            return time.perf_counter() - started
        finally:
            await store.close()


def _repeat(action: str, shape: str, runs: int, steps: int, concurrency: int, repeats: int) -> dict[str, float]:
    total = runs * steps
    samples = []
    for i in range(repeats):
        samples.append(asyncio.run(_measure(action, runs, steps, concurrency)))
        progress("throughput", f"{action}, {shape}, repeat {i + 1}/{repeats}: {total / samples[-1]:.0f} steps/s")
    rates = sorted(total / s for s in samples)
    return {"median": statistics.median(rates), "min": rates[0], "max": rates[-1]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps in the one-run shape")
    parser.add_argument("--runs", type=int, default=200, help="runs in the many-runs shape (5 steps each)")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", type=Path, help="write the results as Markdown to this file")
    args = parse_args(parser, argv, quick={"steps": 100, "runs": 20, "repeats": 1})
    load = LoadReport("throughput")
    freeze_heap()  # as `roadie worker` does once it has started: this process stands in for one

    rows = []
    for action in ("none", "ledger"):
        for shape, runs, steps in (
            (f"1 run × {args.steps} steps", 1, args.steps),
            (f"{args.runs} runs × 5 steps", args.runs, 5),
        ):
            result = _repeat(action, shape, runs, steps, args.concurrency, args.repeats)
            rows.append((action, shape, result))
            low, high = result["min"], result["max"]
            print(f"{action:<8} {shape:<22} {result['median']:8.0f} steps/s (min {low:.0f}, max {high:.0f})")
    load_line = load.end()
    print(load_line)
    if args.write:
        base = rows[0][2]["median"]
        lines = [
            "## One worker, per reversible class",
            "",
            "Step throughput of one worker on SQLite (WAL, synchronous=FULL) with an in-process no-op module.",
            f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
            f"{platform.system()}; concurrency {args.concurrency}; median of {args.repeats} (min–max).",
            "",
            load_line,
            "",
            f"Command: `.venv/bin/python benchmarks/throughput.py --write {args.write}`",
            "",
            "| class | shape | steps/s median | min | max | ratio to `none`, 1 run |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for action, shape, r in rows:
            figures = f"{r['median']:.0f} | {r['min']:.0f} | {r['max']:.0f} | {r['median'] / base:.2f}"
            lines.append(f"| `{action}` | {shape} | {figures} |")
        write_section(args.write, "throughput.py", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

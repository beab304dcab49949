"""Profile one worker draining the throughput benchmark's ledger run, with pyinstrument.

    .venv/bin/python -m pip install -e '.[bench]'
    .venv/bin/python benchmarks/profile_drain.py --runs 200 --steps 5

Prints pyinstrument's call tree of `Engine.settle` (async-aware: time awaited inside a
coroutine is charged to it). The results and what was changed after reading them are in
docs/benchmarks.md, "Where the time goes".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time

from pyinstrument import Profiler
from throughput import open_bench


async def _profile(action: str, runs: int, steps: int, concurrency: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        store, engine, event = await open_bench(f"sqlite:///{tmp}/bench.db", action, steps, concurrency)
        try:
            ids = [(await engine.start_run(event, {})).id for _ in range(runs)]
            profiler = Profiler(async_mode="enabled", interval=0.0005)
            started = time.perf_counter()
            profiler.start()
            await engine.settle(ids)
            profiler.stop()
            elapsed = time.perf_counter() - started
        finally:
            await store.close()
    rate = runs * steps / elapsed
    tree: str = profiler.output_text(unicode=False, color=False)
    return f"{runs} runs × {steps} `bench.{action}` steps: {elapsed:.2f} s ({rate:.0f} steps/s)\n\n{tree}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--action", default="ledger", choices=["none", "ledger"])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args(argv)
    print(asyncio.run(_profile(args.action, args.runs, args.steps, args.concurrency)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""CPU work per ledgered step, counted in instructions: a figure that holds on a busy machine.

Two fixed shapes on SQLite, settled by one engine as `dbos_compare.py` does: one run of
200 `bench.ledger` steps and 40 runs of 5. Each shape gets a fresh database and store,
settles one run (two of 5) unmeasured, as a long-lived worker has compiled its statements
long since, and is then measured once. (`dbos_compare.py` opens a fresh store for each
measurement, so it also pays SQLAlchemy's compiling of some twenty statements per store.)

Under callgrind the count covers only the measured part (start to settle, every thread):
a tiny helper compiled with gcc issues callgrind's client requests around it, and
`--instr-atstart=no` leaves start-up uninstrumented. Instruction counts do not move with
the machine's load, so a change of a few per cent can be seen.

    .venv/bin/python benchmarks/step_cost.py --callgrind   # runs itself under valgrind
    .venv/bin/python benchmarks/step_cost.py --profile    # cProfile of the measured part
    .venv/bin/python benchmarks/step_cost.py --callgrind --transactions   # one empty transaction

Outside callgrind it prints CPU seconds per step instead (noisy on a shared host).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import glob
import logging
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from throughput import open_bench

from roadie.runtime import freeze_heap
from roadie.store import Store

_MARK_C = r"""
#include <valgrind/callgrind.h>
void mark_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void mark_stop(const char *name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""

SHAPES = (("1x200", 1, 200), ("40x5", 40, 5))
TRANSACTIONS = 200  # of each kind, with --transactions
WARM = (("warm 1x20", 1, 20), ("warm 4x5", 4, 5))


def _marker(tmp: Path) -> ctypes.CDLL | None:
    """callgrind's client requests, or None where gcc or valgrind's headers are missing."""
    source, lib = tmp / "mark.c", tmp / "mark.so"
    source.write_text(_MARK_C)
    made = subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(source)], capture_output=True)
    return ctypes.CDLL(str(lib)) if made.returncode == 0 else None


async def _shape(
    url: str, runs: int, steps: int, mark: ctypes.CDLL | None, name: str | None, profiler: cProfile.Profile | None
) -> float:
    store, engine, event = await open_bench(url, "ledger", steps, concurrency=100)
    try:
        # The same shape once before, on the same store: a worker's engine has compiled its
        # statements long since (SQLAlchemy keeps them per engine); this counts the steps.
        warm = [await engine.start_run(event, {})] if runs == 1 else await engine.start_runs(event, [{}] * 2)
        await engine.settle([run.id for run in warm])
        if name is not None and mark is not None:
            mark.mark_start()
        if profiler is not None:
            profiler.enable()
        started = time.process_time()
        made = [await engine.start_run(event, {})] if runs == 1 else await engine.start_runs(event, [{}] * runs)
        await engine.settle([run.id for run in made])
        cpu = time.process_time() - started
        if profiler is not None:
            profiler.disable()
        if name is not None and mark is not None:
            mark.mark_stop(name.encode())
        return cpu
    finally:
        await store.close()


async def _transactions(url: str, mark: ctypes.CDLL | None) -> None:
    """`select(1)` through the store's read and write transactions, TRANSACTIONS of each kind."""
    store = await Store.open(url)
    statement = select(1)

    async def work(conn: AsyncConnection) -> None:
        await conn.execute(statement)

    kinds: dict[str, Callable[[], Awaitable[Any]]] = {
        "read": lambda: store._read(work),
        "read1": lambda: store._read(work, one_statement=True),
        "write": lambda: store._write("bench", work),
    }
    try:
        for _ in range(20):  # compiled, and the pool's connections open
            for run in kinds.values():
                await run()
        for name, run in kinds.items():
            if mark is not None:
                mark.mark_start()
            for _ in range(TRANSACTIONS):
                await run()
            if mark is not None:
                mark.mark_stop(name.encode())
    finally:
        await store.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions of the measured part")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--callgrind", action="store_true", help="run under callgrind: instructions per step")
    parser.add_argument("--keep", type=Path, help="with --callgrind: copy callgrind's dumps into this folder")
    parser.add_argument("--transactions", action="store_true", help="count empty store transactions, not steps")
    args = parser.parse_args(argv)
    if args.callgrind:
        return _callgrind(args.keep, ["--transactions"] if args.transactions else [])
    logging.disable(logging.CRITICAL)  # the store's close-time chatter, not what is measured
    if args.transactions:
        with tempfile.TemporaryDirectory() as tmp_name:
            asyncio.run(_transactions(f"sqlite:///{tmp_name}/t.db", _marker(Path(tmp_name))))
        return 0
    freeze_heap()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mark = _marker(tmp)
        for i, (_, runs, steps) in enumerate(WARM):
            asyncio.run(_shape(f"sqlite:///{tmp}/warm{i}.db", runs, steps, None, None, None))
        profiler = cProfile.Profile() if args.profile else None
        for name, runs, steps in SHAPES:
            cpu = asyncio.run(_shape(f"sqlite:///{tmp}/{name}.db", runs, steps, mark, name, profiler))
            print(f"{name}: {cpu / (runs * steps) * 1e6:.0f} µs CPU per step (process_time)", flush=True)
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        _by_package(stats)
    return 0


def _by_package(stats: pstats.Stats) -> None:
    """Own time summed by where the code lives: roadie, SQLAlchemy, asyncio, C built-ins."""
    totals: dict[str, float] = {}
    for (path, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        if path == "~":
            place = function if function.startswith(("<method 'poll'", "<method 'put_nowait'")) else "(C built-ins)"
        else:
            place = path.split("site-packages/")[-1].split("/")[0] if "site-packages/" in path else path
            place = "roadie/" + path.split("src/roadie/")[-1] if "src/roadie/" in path else place
            stdlib = "/lib/python3" in path and "site-packages" not in path
            place = "(stdlib) " + path.rsplit("/", 1)[-1] if stdlib else place
        totals[place] = totals.get(place, 0.0) + row[2]
    for place, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:30]:
        print(f"{seconds * 1000:8.1f} ms  {place}")


def _callgrind(keep: Path | None, extra: list[str]) -> int:
    """Run this script under callgrind and print instructions per step from its dumps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        done = subprocess.run([*command, sys.executable, __file__, *extra], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        for path in sorted(glob.glob(f"{out}.*")):
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, keep)
            desc = total = ""
            for line in Path(path).read_text(errors="replace").splitlines():
                if line.startswith("desc: Trigger:"):
                    desc = line.rsplit(" ", 1)[-1]
                elif line.startswith(("summary:", "totals:")):
                    total = line.split()[1]
            for name, runs, steps in SHAPES:
                if desc == name and total:
                    print(f"{name}: {int(total) / (runs * steps) / 1e6:.3f} M instructions per step", flush=True)
            if desc in ("read", "read1", "write") and total:
                print(f"{desc}: {int(total) / TRANSACTIONS:,.0f} instructions per transaction", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Roadie side by side with DBOS Transact: the same shapes, the same database server, one run.

Shapes: one run (workflow) of N trivial steps in one phase, and R runs (workflows) of 5
steps. Roadie: an in-process no-op module, one Engine, a FakeClock, `engine.settle`, for
the `none` and `ledger` reversible classes (as in throughput.py). DBOS: a `@DBOS.workflow()`
calling a trivial `@DBOS.step()` n times; one workflow is called directly, many are
started with `DBOS.start_workflow` and their results awaited. Each measurement gets a
fresh database (a new SQLite file, or a new database on the PostgreSQL server) and is
timed from the first run or workflow started to the last one ended, creation included
on both sides. Repetitions are interleaved (Roadie `none`, Roadie `ledger`, DBOS, then
again) so that drift on a shared machine hits all three alike; medians with min and max.

`--contention` runs every measurement of both sides under the standard background load
(`report.Contention`: one CPU-bound process per CPU and one process doing small fsync'd
writes), started before the first and stopped after the last, as a shared host is busy.

`dbos` is a benchmark-only dependency (`pip install -e '.[bench]'`), never a runtime one.

    .venv/bin/python benchmarks/dbos_compare.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/dbos_compare.py --contention --write docs/benchmarks.md
    .venv/bin/python benchmarks/dbos_compare.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from importlib.metadata import version
from pathlib import Path

from report import Contention, LoadReport, parse_args, progress, write_section
from sqlalchemy.ext.asyncio import create_async_engine
from throughput import open_bench
from workers import DEFAULT_SERVERS, Database, _reachable

from roadie.runtime import freeze_heap
from roadie.store.dialects import async_url

try:
    from dbos import DBOS, DBOSConfig
except ImportError:  # pragma: no cover - reported by main()
    DBOS = None  # type: ignore[assignment,misc]


if DBOS is not None:

    @DBOS.step()
    def trivial_step() -> None:
        return None

    @DBOS.workflow()
    def trivial_workflow(n: int) -> int:
        for _ in range(n):
            trivial_step()
        return n


async def _roadie(url: str, action: str, runs: int, steps: int, concurrency: int) -> float:
    """Seconds for one Roadie engine to start and settle `runs` runs of `steps` steps."""
    store, engine, event = await open_bench(url, action, steps, concurrency)
    try:
        started = time.perf_counter()
        # Many runs are created as an operator or a schedule makes them: in one batch.
        made = [await engine.start_run(event, {})] if runs == 1 else await engine.start_runs(event, [{}] * runs)
        ids = [run.id for run in made]
        await engine.settle(ids)
        return time.perf_counter() - started
    finally:
        await store.close()


def _dbos(url: str, runs: int, steps: int) -> float:
    """Seconds for DBOS to run `runs` workflows of `steps` trivial steps to completion."""
    config: DBOSConfig = {"name": "roadie-bench", "system_database_url": url, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        started = time.perf_counter()
        if runs == 1:
            trivial_workflow(steps)
        else:
            handles = [DBOS.start_workflow(trivial_workflow, steps) for _ in range(runs)]
            for handle in handles:
                handle.get_result()
        return time.perf_counter() - started
    finally:
        DBOS.destroy()


def _summary(rates: list[float]) -> dict[str, float]:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def _server_version(server: str) -> str:
    async def ask() -> str:
        engine = create_async_engine(async_url(server))
        try:
            async with engine.connect() as conn:
                return str((await conn.exec_driver_sql("SHOW server_version")).scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(ask()).split()[0]


def _section(
    rows: list[tuple[str, str, str, dict[str, float], float]], args: argparse.Namespace, env: str, load: str
) -> str:
    title = "## Side by side with DBOS, under contention" if args.contention else "## Side by side with DBOS"
    flag = " --contention" if args.contention else ""
    lines = [
        title,
        "",
        "The same shapes as Roadie runs (in-process no-op module, one engine, concurrency "
        f"{args.concurrency}, `engine.settle`) and as DBOS Transact workflows of trivial `@DBOS.step()` steps "
        "(one workflow called directly; many started with `DBOS.start_workflow`, DBOS's default executor), "
        "on the same database server in the same process run, whose start-up heap is frozen as a worker's is "
        "(`roadie.runtime.freeze_heap`). Each measurement gets a fresh database and is "
        "timed from the first run or workflow started to the last ended, creation included on both sides; "
        f"repetitions are interleaved; median of {args.repeats} (min–max). Roadie's SQLite is WAL with "
        "synchronous=FULL; DBOS's is its own default (rollback journal, `BEGIN IMMEDIATE`).",
        "",
        env,
        "",
        load,
        "",
        f"Command: `.venv/bin/python benchmarks/dbos_compare.py{flag} --write {args.write}`",
        "",
        "| database | shape | system | steps/s median | min | max | ratio Roadie/DBOS |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for backend, shape, system, r, ratio in rows:
        figures = f"{r['median']:.0f} | {r['min']:.0f} | {r['max']:.0f}"
        lines.append(f"| {backend} | {shape} | {system} | {figures} | {ratio:.2f} |")
    lines += [
        "",
        "The ratio is the Roadie median over the DBOS median for the same shape and database; above 1",
        "means Roadie moved more steps per second. The two do not do identical work per step (Roadie",
        "keeps its own run and step records, and a `ledger` step also records what it made), so read the",
        "ratio as the cost of one durable step in each, on this machine, in this run.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--postgresql", default=os.environ.get("ROADIE_TEST_POSTGRESQL", DEFAULT_SERVERS["postgresql"]))
    parser.add_argument("--steps", type=int, default=1000, help="steps in the one-run shape")
    parser.add_argument("--runs", type=int, default=200, help="runs in the many-runs shape (5 steps each)")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--contention",
        action="store_true",
        help="time both sides under the standard background load: a CPU-bound process per CPU, one fsync writer",
    )
    parser.add_argument("--write", type=Path, help="write (or replace) this script's section in this Markdown file")
    args = parse_args(parser, argv, quick={"databases": "sqlite", "steps": 100, "runs": 20, "repeats": 1})
    freeze_heap()  # as `roadie worker` does once it has started: this process stands in for one

    if DBOS is None:
        print("dbos is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    logging.getLogger("dbos").setLevel(logging.WARNING)
    load = LoadReport("dbos_compare")

    versions = [f"SQLite {sqlite3.sqlite_version}"]
    rows: list[tuple[str, str, str, dict[str, float], float]] = []
    contention = Contention("dbos_compare") if args.contention else None
    with tempfile.TemporaryDirectory() as tmp, contention or nullcontext():
        for backend in [b.strip() for b in args.databases.split(",") if b.strip()]:
            server = None if backend == "sqlite" else getattr(args, backend)
            if server is not None:
                problem = _reachable(backend, server)
                if problem:
                    print(f"skipped: {problem}", file=sys.stderr)
                    continue
                versions.append(f"PostgreSQL {_server_version(server)}")
            db = Database(backend, server, Path(tmp))
            for shape, runs, steps in (
                (f"1 run × {args.steps} steps", 1, args.steps),
                (f"{args.runs} runs × 5 steps", args.runs, 5),
            ):
                samples: dict[str, list[float]] = {"none": [], "ledger": [], "dbos": []}
                for i in range(args.repeats):
                    for system in samples:
                        url = db.fresh()
                        try:
                            if system == "dbos":
                                seconds = _dbos(url, runs, steps)
                            else:
                                seconds = asyncio.run(_roadie(url, system, runs, steps, args.concurrency))
                        finally:
                            db.drop()
                        samples[system].append(runs * steps / seconds)
                        name = "DBOS" if system == "dbos" else f"Roadie {system}"
                        piece = f"{backend} {shape}, repeat {i + 1}/{args.repeats}"
                        progress("dbos_compare", f"{piece}: {name} {samples[system][-1]:.0f} steps/s")
                results = {system: _summary(rates) for system, rates in samples.items()}
                dbos_median = results["dbos"]["median"]
                for system, label in (("none", "Roadie `none`"), ("ledger", "Roadie `ledger`"), ("dbos", "DBOS")):
                    r = results[system]
                    ratio = r["median"] / dbos_median if system != "dbos" else 1.0
                    rows.append((backend, shape, label, r, ratio))
                    print(
                        f"{backend:<10} {shape:<20} {label:<16} {r['median']:7.0f} steps/s"
                        f" (min {r['min']:.0f}, max {r['max']:.0f}); Roadie/DBOS {ratio:.2f}",
                        flush=True,
                    )
    env = (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}; roadie {version('roadie')}, dbos {version('dbos')}, "
        f"SQLAlchemy {version('sqlalchemy')}; {', '.join(versions)} (server on the same machine)."
    )
    print(env)
    load_line = load.end()
    if contention is not None:
        load_line += "\n\n" + contention.line
    print(load_line)
    if args.write:
        script = "dbos_compare.py --contention" if args.contention else "dbos_compare.py"
        write_section(args.write, script, _section(rows, args, env, load_line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

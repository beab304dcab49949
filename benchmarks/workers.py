"""Step throughput of 1, 2 and 4 worker processes, on each database, with ratios to 1.

Each measurement: a fresh database holding R runs of S no-op steps (one phase, cleanup
manual, so only the drain is measured), then N `roadie worker` processes started on it.
Throughput is steps divided by the time from the first step claimed to the last one
ended, as the steps' own timestamps say, so process start-up is not counted. The module
is `benchmarks/noop_module.py`, loaded through `roadie.toml` (`import =`).

    .venv/bin/python benchmarks/workers.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/workers.py --databases sqlite --runs 100
    .venv/bin/python benchmarks/workers.py --quick

Database URLs: `--sqlite` (a temp file by default), `--postgresql`, `--mariadb` (servers
on which a fresh database is created, and dropped, per measurement). A server that
cannot be reached is reported and left out. The section written to `--write` sits
between markers and replaces only itself.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from report import LoadReport, parse_args, progress, write_section
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from roadie.clock import SystemClock
from roadie.definitions import EventDefinition
from roadie.engine import Engine
from roadie.modules import core
from roadie.registry import Registry
from roadie.states import RunStatus
from roadie.store import Store
from roadie.store.dialects import async_url
from roadie.store.tables import runs as runs_table
from roadie.store.tables import steps as steps_table

HERE = Path(__file__).resolve().parent
DEFAULT_SERVERS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql://root@127.0.0.1:3306/test",
}


async def _admin(url: str, statement: str) -> None:
    engine = create_async_engine(async_url(url), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()


class Database:
    """Where one measurement runs: a fresh SQLite file, or a fresh database on a server."""

    def __init__(self, backend: str, server: str | None, home: Path) -> None:
        self.backend, self.server, self.home = backend, server, home
        self.name: str | None = None

    def fresh(self) -> str:
        if self.backend == "sqlite":
            path = self.home / f"bench-{secrets.token_hex(4)}.db"
            return f"sqlite:///{path}"
        assert self.server is not None
        self.name = f"roadie_bench_{secrets.token_hex(4)}"
        asyncio.run(_admin(self.server, f"CREATE DATABASE {self.name}"))
        return make_url(self.server).set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        if self.name and self.server:
            asyncio.run(_admin(self.server, f"DROP DATABASE IF EXISTS {self.name}"))
        self.name = None


async def _prepare(url: str, action: str, runs: int, steps: int) -> list[int]:
    store = await Store.open(url)
    try:
        now = datetime.now(UTC)
        definition = EventDefinition.model_validate(
            {
                "id": f"bench-{action}",
                "cleanup": "manual",
                "phases": [{"name": "all", "steps": [{"action": f"noop.{action}"} for _ in range(steps)]}],
            }
        )
        frozen = definition.model_dump(mode="json", by_alias=True)
        event = await store.create_event_version(definition.id, "", frozen, "", "bench", now)
        # Runs are created as the engine would create them; materialising their steps is
        # left to the workers, as part of what is measured.
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        registry = Registry(SystemClock())
        registry.register(core.module)
        registry.register(importlib.import_module("noop_module").module)
        engine = Engine(store, registry)
        return [(await engine.start_run(event, {})).id for _ in range(runs)]
    finally:
        await store.close()


async def _progress(url: str, ids: list[int]) -> tuple[int, Any, Any]:
    """(runs not yet ended, first step claimed, last step ended)."""
    store = await Store.open(url, migrate_schema=False)
    try:
        async with store.engine.connect() as conn:
            open_runs = (
                await conn.execute(
                    select(func.count())
                    .select_from(runs_table)
                    .where(
                        runs_table.c.id.in_(ids),
                        runs_table.c.status.in_([RunStatus.PENDING.value, RunStatus.RUNNING.value]),
                    )
                )
            ).scalar_one()
            first, last = (
                await conn.execute(select(func.min(steps_table.c.started_at), func.max(steps_table.c.ended_at)))
            ).one()
        return int(open_runs), first, last
    finally:
        await store.close()


def _measure(db: Database, action: str, workers: int, runs: int, steps: int, concurrency: int) -> float:
    """Steps per second for `workers` processes draining `runs` x `steps` no-op steps."""
    url = db.fresh()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ids = asyncio.run(_prepare(url, action, runs, steps))
        home = Path(tempfile.mkdtemp(prefix="roadie-bench-", dir=db.home))
        (home / "roadie.toml").write_text(
            '[engine]\npoll_interval = 0.05\n\n[modules.noop]\nimport = "noop_module:module"\n'
        )
        env = {**os.environ, "ROADIE_DATABASE_URL": url, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        for n in range(workers):
            with (home / f"worker-{n}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "roadie.cli.main", "worker", "--concurrency", str(concurrency)],
                        cwd=home,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
        deadline = time.monotonic() + 600
        while True:
            remaining, first, last = asyncio.run(_progress(url, ids))
            if remaining == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{remaining} runs did not end within 600 s")
            time.sleep(0.2)
        seconds = (_as_datetime(last) - _as_datetime(first)).total_seconds()
        return runs * steps / max(seconds, 1e-6)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        db.drop()


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _reachable(backend: str, server: str) -> str | None:
    try:
        asyncio.run(asyncio.wait_for(_admin(server, "SELECT 1"), 10))
    except Exception as exc:
        return f"{backend} at {server} is unreachable: {exc}"
    return None


def _section(results: list[tuple[str, str, dict[int, list[float]]]], args: argparse.Namespace, load: str) -> str:
    command = "`.venv/bin/python benchmarks/workers.py --write docs/benchmarks.md`"
    lines = [
        "## Worker processes: 1, 2 and 4",
        "",
        f"Step throughput of N `roadie worker` processes (concurrency {args.concurrency} each) on one database, "
        f"draining {args.runs} runs × {args.steps} steps of an in-process no-op module (cleanup manual). "
        "Steps/s is steps over the span from the first step claimed to the last ended; "
        f"median of {args.repeats} (min–max). "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}; database servers on the same machine.",
        "",
        load,
        "",
        f"Command: {command}",
        "",
        "| database | class | workers | steps/s median | min | max | ratio to 1 worker |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for backend, action, by_workers in results:
        base = statistics.median(by_workers[1]) if by_workers.get(1) else None
        for n, samples in sorted(by_workers.items()):
            median = statistics.median(samples)
            ratio = f"{median / base:.2f}" if base else "–"
            lines.append(
                f"| {backend} | `{action}` | {n} | {median:.0f} | {min(samples):.0f} | {max(samples):.0f} | {ratio} |"
            )
    lines += [
        "",
        "SQLite takes one writer at a time (WAL, `BEGIN IMMEDIATE`), so more processes on one file add",
        "contention, not capacity: it is the one-machine default. PostgreSQL and MariaDB claim with",
        "row locks, so workers on many machines share the queue.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--databases", default="sqlite,postgresql,mariadb")
    parser.add_argument("--postgresql", default=os.environ.get("ROADIE_TEST_POSTGRESQL", DEFAULT_SERVERS["postgresql"]))
    parser.add_argument("--mariadb", default=os.environ.get("ROADIE_TEST_MARIADB", DEFAULT_SERVERS["mariadb"]))
    parser.add_argument("--actions", default="none,ledger", help="reversible classes of the no-op steps")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", type=Path, help="write (or replace) this script's section in this Markdown file")
    args = parse_args(parser, argv, quick={"databases": "sqlite", "runs": 20, "steps": 5, "repeats": 1})
    load = LoadReport("workers")

    results: list[tuple[str, str, dict[int, list[float]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in [b.strip() for b in args.databases.split(",") if b.strip()]:
            server = None if backend == "sqlite" else getattr(args, backend)
            if server is not None:
                problem = _reachable(backend, server)
                if problem:
                    print(f"skipped: {problem}", file=sys.stderr)
                    continue
            db = Database(backend, server, Path(tmp))
            for action in args.actions.split(","):
                by_workers: dict[int, list[float]] = {}
                for n in [int(w) for w in args.workers.split(",")]:
                    samples: list[float] = []
                    by_workers[n] = samples
                    for i in range(args.repeats):
                        samples.append(_measure(db, action, n, args.runs, args.steps, args.concurrency))
                        progress(
                            "workers",
                            f"{backend} {action}, {n} workers, repeat {i + 1}/{args.repeats}: "
                            f"{samples[-1]:.0f} steps/s",
                        )
                    print(
                        f"{backend:<10} {action:<7} {n} workers: {statistics.median(samples):7.0f} steps/s"
                        f" (min {min(samples):.0f}, max {max(samples):.0f})",
                        flush=True,
                    )
                results.append((backend, action, by_workers))
    load_line = load.end()
    print(load_line)
    if args.write:
        write_section(args.write, "workers.py", _section(results, args, load_line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

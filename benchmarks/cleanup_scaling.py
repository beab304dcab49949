"""Cleanup time and peak memory for runs holding 1,000, 10,000 and 100,000 ledgered resources.

Each measurement builds one run on a fresh database: its steps are a no-op `ledger` action
of an in-process module that reports K resources each, drained by `Engine.settle` with a
`FakeClock` (cleanup manual, so nothing is reverted yet). Then `engine.clean_up` alone is
timed; its revert is a no-op that answers None and its `inspect` answers "gone" for
every resource, so what is measured is cleanup's reading and marking of the ledger and its
proof (DESIGN §12: every reverted row read back through `inspect`, a verdict). Peak
memory is measured in a separate cleanup of a run built the same way, with tracemalloc
started just before `clean_up` and its peak read after (tracemalloc slows Python down, so
the timed runs go without it); the RSS delta is the growth of the process's peak RSS over
its RSS before cleanup (Linux `clear_refs`).

Two shapes: K = 1,000 resources per step (1, 10, 100 steps), and K = 10 resources per
step (100, 1,000, 10,000 steps), which makes cleanup page through many pages of steps.

    .venv/bin/python benchmarks/cleanup_scaling.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/cleanup_scaling.py --postgresql postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python benchmarks/cleanup_scaling.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict
from report import LoadReport, parse_args, progress, write_section
from workers import Database, _reachable

from roadie.clock import FakeClock
from roadie.definitions import EventDefinition
from roadie.engine import Engine, EngineOptions
from roadie.modules import core
from roadie.registry import Call, InspectCall, Inspected, Module, Registry, RevertCall
from roadie.runtime import freeze_heap
from roadie.states import Reversible
from roadie.store import Store

scale = Module("scale", "reports many resources per step, reverts them at once")


class Many(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int


@scale.action("many", reversible=Reversible.LEDGER, params=Many)
def many(call: Call[Many]) -> list[dict[str, Any]]:
    key = call.idempotency_key
    return [{"kind": "thing", "ref": f"{key}-{i}"} for i in range(call.params.count)]


@many.revert
def unmany(call: RevertCall) -> None:
    return None


@scale.inspect
def gone(call: InspectCall) -> list[Inspected]:
    return [Inspected(r.kind, r.ref, exists=False, ours=False) for r in call.resources]


@dataclass
class Sample:
    seconds: float | None = None
    peak_bytes: int | None = None
    rss_delta_kib: int | None = None
    reverted: int = 0


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def _one(url: str, steps: int, per_step: int, *, trace: bool) -> Sample:
    clock = FakeClock()
    registry = Registry(clock)
    registry.register(core.module)
    registry.register(scale)
    store = await Store.open(url)
    try:
        engine = Engine(store, registry, clock=clock, options=EngineOptions(concurrency=100))
        definition = EventDefinition.model_validate(
            {
                "id": "bench-cleanup",
                "cleanup": "manual",
                "phases": [{"name": "all", "steps": [{"action": "scale.many", "with": {"count": per_step}}] * steps}],
            }
        )
        event = await store.create_event_version(
            definition.id, "", definition.model_dump(mode="json", by_alias=True), "", "bench", clock.now()
        )
        run_id = (await engine.start_run(event, {})).id
        await engine.settle([run_id])
        live = len(await store.list_resources(run_id, live_only=True))
        assert live == steps * per_step, f"the ledger holds {live} live rows, not {steps * per_step}"
        gc.collect()
        sample = Sample()
        if trace:
            rss_before = _status_kib("VmRSS") if _reset_peak_rss() else None
            tracemalloc.start()
            report = await engine.clean_up(run_id, actor="bench")
            _, sample.peak_bytes = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            hwm = _status_kib("VmHWM")
            if rss_before is not None and hwm is not None:
                sample.rss_delta_kib = hwm - rss_before
        else:
            started = time.perf_counter()
            report = await engine.clean_up(run_id, actor="bench")
            sample.seconds = time.perf_counter() - started
        assert report.status == "complete", report.as_dict()
        assert report.verdict == "verified_clean", report.as_dict()  # every row was read back
        sample.reverted = report.reverted
        return sample
    finally:
        await store.close()


def _measure(db: Database, steps: int, per_step: int, *, trace: bool) -> Sample:
    url = db.fresh()
    try:
        return asyncio.run(_one(url, steps, per_step, trace=trace))
    finally:
        db.drop()
        if db.backend == "sqlite":
            for path in db.home.glob("*.db*"):
                path.unlink()


@dataclass
class Row:
    backend: str
    per_step: int
    steps: int
    repeats: int
    seconds: list[float]
    peak_bytes: int | None
    rss_delta_kib: int | None
    reverted: int

    @property
    def resources(self) -> int:
        return self.steps * self.per_step

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _run(db: Database, sizes: list[int], per_step: int, repeats: int, big_repeats: int) -> list[Row]:
    rows = []
    for n in sizes:
        steps = max(1, n // per_step)
        count = repeats if n < 100_000 else big_repeats
        piece = f"{db.backend} {steps} steps × {per_step}"
        timed = []
        for i in range(count):
            timed.append(_measure(db, steps, per_step, trace=False))
            progress("cleanup_scaling", f"{piece}, timed {i + 1}/{count}: {timed[-1].seconds:.3f} s")
        traced = _measure(db, steps, per_step, trace=True)
        progress("cleanup_scaling", f"{piece}, traced: peak {(traced.peak_bytes or 0) / 2**20:.1f} MiB")
        row = Row(
            db.backend,
            per_step,
            steps,
            count,
            [s.seconds or 0.0 for s in timed],
            traced.peak_bytes,
            traced.rss_delta_kib,
            timed[0].reverted,
        )
        rows.append(row)
        peak = (row.peak_bytes or 0) / 2**20
        print(
            f"{db.backend:<10} {steps:>6} steps × {per_step:<5} = {row.resources:>7} resources: "
            f"{row.median:7.3f} s median of {count} ({min(row.seconds):.3f}–{max(row.seconds):.3f}), "
            f"{row.median / row.resources * 1e6:6.1f} µs/resource, peak {peak:6.1f} MiB traced, "
            f"RSS +{(row.rss_delta_kib or 0) / 1024:.1f} MiB; reverted {row.reverted} rows",
            flush=True,
        )
    return rows


def _section(rows: list[Row], args: argparse.Namespace, load: str) -> str:
    command = "`.venv/bin/python benchmarks/cleanup_scaling.py --write docs/benchmarks.md`"
    if args.postgresql:
        command = command[:-1] + " --postgresql URL`"
    lines = [
        "## Cleanup scaling",
        "",
        "Time and peak memory of `engine.clean_up(run_id)` alone, for one run holding N ledgered resources, "
        "built beforehand by draining steps of an in-process `ledger` action that reports K resources each "
        "(its revert is a no-op answering None; its inspect answers every resource gone, so the "
        "time includes reading each reverted row back for the verdict). "
        "Time is the median of the repetitions shown (min–max); "
        "peak memory is from one further cleanup of a run built the same way, with tracemalloc started just "
        "before `clean_up` and read after (Python allocations), and the growth of peak RSS over RSS before it. "
        "Each step's placeholder is resolved when its answer is recorded, so the live rows are exactly N.",
        f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()}; SQLite with WAL, synchronous=FULL"
        + ("; PostgreSQL on the same machine" if args.postgresql else "")
        + ".",
        "",
        load,
        "",
        f"Command: {command}",
        "",
        "| database | K per step | steps | N resources | repeats | cleanup s median | min–max | µs per resource "
        "| ratio to 1k µs/resource | peak traced MiB | peak RSS delta MiB | rows reverted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        base = next(r for r in rows if r.backend == row.backend and r.per_step == row.per_step)
        per = row.median / row.resources
        ratio = per / (base.median / base.resources)
        peak = f"{row.peak_bytes / 2**20:.1f}" if row.peak_bytes is not None else "–"
        rss = f"{row.rss_delta_kib / 1024:.1f}" if row.rss_delta_kib is not None else "–"
        lines.append(
            f"| {row.backend} | {row.per_step} | {row.steps} | {row.resources:,} | {row.repeats} | {row.median:.3f} "
            f"| {min(row.seconds):.3f}–{max(row.seconds):.3f} | {per * 1e6:.1f} | {ratio:.2f} | {peak} | {rss} "
            f"| {row.reverted:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--per-step", type=int, nargs="+", default=[1000, 10], help="resources per step (K)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions below 100k resources")
    parser.add_argument("--big-repeats", type=int, default=1, help="timed repetitions at 100k resources")
    parser.add_argument("--postgresql", help="also measure on this server (a fresh database per measurement)")
    parser.add_argument("--write", type=Path, help="write the results as Markdown to this file")
    args = parse_args(parser, argv, quick={"sizes": [1_000, 10_000], "repeats": 1})
    load = LoadReport("cleanup_scaling")
    freeze_heap()  # as `roadie worker` does once it has started: this process stands in for one
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    home = Path(tempfile.mkdtemp(prefix="roadie-cleanup-"))
    databases = [Database("sqlite", None, home)]
    if args.postgresql:
        problem = _reachable("postgresql", args.postgresql)
        if problem:
            print(problem, file=sys.stderr)
        else:
            databases.append(Database("postgresql", args.postgresql, home))
    rows: list[Row] = []
    for db in databases:
        for per_step in args.per_step:
            rows.extend(_run(db, args.sizes, per_step, args.repeats, args.big_repeats))
    shutil.rmtree(home, ignore_errors=True)
    load_line = load.end()
    print(load_line)
    if args.write:
        write_section(args.write, "cleanup_scaling.py", _section(rows, args, load_line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

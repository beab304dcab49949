"""Roadie's ledgered step throughput against what the database can commit at all.

Three measurements per database, each on a fresh database, median of several repeats:

1. Roadie: one run of N `ledger` steps of an in-process no-op module, drained by one
   engine (`Engine.settle`, FakeClock, concurrency C), as in `throughput.py`. Every write
   transaction is counted through `Store.write_point` (called once before each commit),
   with the rows each one inserted and updated (SQLAlchemy's cursor events), and the
   batch sizes of the claims and records.
2. Bare replay: the same driver and engine settings (`roadie.store.dialects.create_engine`:
   for SQLite WAL, synchronous=FULL, BEGIN IMMEDIATE) committing the same transactions in
   the same order with the same batch sizes, as plain INSERTs and UPDATEs on two simple
   tables: a claim is UPDATE steps + INSERT placeholders, a record is INSERT resources +
   UPDATE placeholders + UPDATE steps, a materialise is INSERT steps, and every other
   commit Roadie made (moving the run on, ending it) is a one-row UPDATE. No reads.
3. Bare minimum: the strict minimum for ledgered steps, one commit before any dispatch
   (claim + placeholders) and one after the answers (resources + resolve + end), per
   batch of C steps, with the same rows.

    .venv/bin/python benchmarks/commit_limit.py --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from report import write_section
from sqlalchemy import Column, Insert, Integer, MetaData, String, Table, Update, bindparam, event, insert, update
from sqlalchemy.ext.asyncio import AsyncConnection
from throughput import open_bench
from workers import DEFAULT_SERVERS, Database, _reachable

from roadie.runtime import freeze_heap
from roadie.store import Store
from roadie.store.dialects import create_engine


@dataclass
class Census:
    """What Roadie committed while draining: one entry per write transaction, in order."""

    transactions: list[tuple[str, int]] = field(default_factory=list)  # (name, steps or rows in it)
    rows: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    pending: Counter[str] = field(default_factory=Counter)
    size: int = 0  # steps in the transaction under way, set by the wrapped store methods

    def statement(self, clause: Any, multiparams: Any, params: Any, result: Any) -> None:
        if isinstance(clause, Insert):
            # Rows offered: an insert that skips a duplicate offered it all the same.
            if clause.select is not None:  # rows unnested from arrays (PostgreSQL), given as rows_KEY
                given = multiparams[0] if multiparams else params
                rows = next(len(v) for k, v in given.items() if k.startswith("rows_"))
            else:
                rows = len(multiparams) if isinstance(multiparams, list | tuple) and multiparams else 1
            self.pending[f"INSERT {clause.table.name}"] += rows
        elif isinstance(clause, Update):
            label = f"UPDATE {clause.table.name}"
            if clause._returning:
                # UPDATE ... RETURNING counts its rows only as they are fetched: the claim's
                # wrapper adds them from what it returned.
                return
            if result.rowcount > 0:
                self.pending[label] += result.rowcount

    def commit(self, name: str) -> None:
        self.transactions.append((name, self.size))
        self.rows[name].update(self.pending)
        self.pending.clear()


def _instrument(store: Store, census: Census) -> None:
    @event.listens_for(store.engine.sync_engine, "after_execute")
    def _after(conn: Any, clause: Any, multiparams: Any, params: Any, options: Any, result: Any) -> None:
        census.statement(clause, multiparams, params, result)

    @event.listens_for(store.engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        census.pending.clear()

    store.write_point = census.commit
    claim, record, advance = store.claim_steps, store.record_outcomes, store.advance_runs

    async def claim_steps(*args: Any, **kwargs: Any) -> Any:
        result = await claim(*args, **kwargs)
        # A claim that found nothing still commits; its size is known only now.
        if census.transactions and census.transactions[-1][0] == "claim_steps":
            census.transactions[-1] = ("claim_steps", len(result))
            census.rows["claim_steps"]["UPDATE steps"] += len(result)
        return result

    async def record_outcomes(outcomes: list[Any]) -> None:
        census.size = len(outcomes)
        try:
            await record(outcomes)
        finally:
            census.size = 0

    async def advance_runs(moves: list[Any], now: Any) -> None:
        census.size = sum(len(m.steps) for m in moves)
        try:
            await advance(moves, now)
        finally:
            census.size = 0

    store.claim_steps = claim_steps  # type: ignore[method-assign]
    store.record_outcomes = record_outcomes  # type: ignore[method-assign]
    store.advance_runs = advance_runs  # type: ignore[method-assign]


async def _roadie(url: str, steps: int, concurrency: int) -> tuple[float, Census]:
    store, engine, event_row = await open_bench(url, "ledger", steps, concurrency)
    try:
        run_id = (await engine.start_run(event_row, {})).id
        census = Census()
        _instrument(store, census)
        started = time.perf_counter()
        await engine.settle([run_id])
        elapsed = time.perf_counter() - started
        done = [s for s in await store.list_steps(run_id) if s.status == "succeeded"]
        assert len(done) == steps, f"{len(done)} of {steps} steps succeeded"
        return elapsed, census
    finally:
        await store.close()


bare = MetaData()
bare_steps = Table(
    "bare_steps",
    bare,
    Column("id", Integer, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("claimed_by", String(100)),
    Column("attempts", Integer, nullable=False),
    Column("output", String(200)),
)
bare_resources = Table(
    "bare_resources",
    bare,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("step_id", Integer, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("ref", String(190), nullable=False, index=True),
    Column("state", String(16), nullable=False),
)
bare_runs = Table("bare_runs", bare, Column("id", Integer, primary_key=True), Column("ticks", Integer, nullable=False))


class Bare:
    """Plain writes on simple tables, one method per transaction shape."""

    def __init__(self, conn_factory: Any) -> None:
        self.connect = conn_factory
        self.next_step = 1

    async def _tx(self, work: Any) -> None:
        async with self.connect() as conn, conn.begin():
            await work(conn)

    async def materialise(self, n: int) -> list[int]:
        ids = list(range(self.next_step, self.next_step + n))
        self.next_step += n

        async def work(conn: AsyncConnection) -> None:
            if ids:
                rows = [{"id": i, "status": "ready", "attempts": 0} for i in ids]
                await conn.execute(insert(bare_steps), rows)

        await self._tx(work)
        return ids

    async def claim(self, ids: list[int]) -> None:
        async def work(conn: AsyncConnection) -> None:
            if not ids:
                return
            await conn.execute(
                update(bare_steps)
                .where(bare_steps.c.id.in_(ids))
                .values(status="running", claimed_by="bare", attempts=bare_steps.c.attempts + 1)
            )
            rows = [{"step_id": i, "kind": "@step", "ref": f"key-{i}", "state": "pending"} for i in ids]
            await conn.execute(insert(bare_resources), rows)

        await self._tx(work)

    async def record(self, ids: list[int]) -> None:
        async def work(conn: AsyncConnection) -> None:
            rows = [{"step_id": i, "kind": "thing", "ref": f"thing-{i}", "state": "live"} for i in ids]
            await conn.execute(insert(bare_resources), rows)
            await conn.execute(
                update(bare_resources)
                .where(bare_resources.c.ref.in_([f"key-{i}" for i in ids]), bare_resources.c.state == "pending")
                .values(state="resolved")
            )
            await conn.execute(
                update(bare_steps)
                .where(bare_steps.c.id == bindparam("b_id"), bare_steps.c.status == "running")
                .values(status="succeeded", claimed_by=None, output=bindparam("b_output")),
                [{"b_id": i, "b_output": None} for i in ids],
            )

        await self._tx(work)

    async def other(self) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(update(bare_runs).where(bare_runs.c.id == 1).values(ticks=bare_runs.c.ticks + 1))

        await self._tx(work)


async def _bare(url: str, plan: list[tuple[str, int]]) -> float:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(bare.create_all)
            await conn.execute(insert(bare_runs), [{"id": 1, "ticks": 0}])
        loop = Bare(engine.connect)
        ready: list[int] = []
        running: list[int] = []
        started = time.perf_counter()
        for name, n in plan:
            if name == "materialise":
                ready.extend(await loop.materialise(n))
            elif name == "claim":
                batch, ready = ready[:n], ready[n:]
                await loop.claim(batch)
                running.extend(batch)
            elif name == "record":
                batch, running = running[:n], running[n:]
                await loop.record(batch)
            elif name == "empty":
                await loop.claim([])  # a write transaction that finds nothing to change
            else:
                await loop.other()
        elapsed = time.perf_counter() - started
        assert not ready, len(ready)
        assert not running, len(running)
        return elapsed
    finally:
        await engine.dispose()


def _replay_plan(census: Census) -> list[tuple[str, int]]:
    plan = []
    for name, n in census.transactions:
        if name == "materialise_phase" and n > 0:
            plan.append(("materialise", n))
        elif name == "claim_steps" and n > 0:
            plan.append(("claim", n))
        elif name in ("claim_steps", "requeue_expired_claims") and n == 0:
            plan.append(("empty", 0))
        elif name == "record_outcomes":
            plan.append(("record", n))
        else:
            plan.append(("other", 0))
    return plan


def _minimum_plan(steps: int, batch: int) -> list[tuple[str, int]]:
    plan: list[tuple[str, int]] = [("materialise", steps)]
    for start in range(0, steps, batch):
        n = min(batch, steps - start)
        plan += [("claim", n), ("record", n)]
    return plan


@dataclass
class Result:
    backend: str
    roadie: list[float]
    replay: list[float]
    minimum: list[float]
    census: Census


def _measure(db: Database, steps: int, concurrency: int, repeats: int) -> Result:
    result = Result(db.backend, [], [], [], Census())
    for _ in range(repeats):
        url = db.fresh()
        try:
            seconds, census = asyncio.run(_roadie(url, steps, concurrency))
        finally:
            db.drop()
        result.roadie.append(seconds)
        result.census = census
        for plan, into in ((_replay_plan(census), result.replay), (_minimum_plan(steps, concurrency), result.minimum)):
            url = db.fresh()
            try:
                into.append(asyncio.run(_bare(url, plan)))
            finally:
                db.drop()
    shutil.rmtree(db.home, ignore_errors=True)
    return result


def _rate(steps: int, seconds: list[float]) -> float:
    return steps / statistics.median(seconds)


def _section(results: list[Result], args: argparse.Namespace) -> str:
    steps, c = args.steps, args.concurrency
    command = "`.venv/bin/python benchmarks/commit_limit.py --write docs/benchmarks.md`"
    lines = [
        "## Against the commit limit",
        "",
        f"One run of {steps} `ledger` steps of an in-process no-op module, drained by one engine at concurrency {c} "
        "(as in `throughput.py`), against the same driver and connection settings "
        "(`roadie.store.dialects.create_engine`; SQLite in WAL with synchronous=FULL and BEGIN IMMEDIATE) committing "
        "plain INSERTs and UPDATEs on simple tables with no reads. *Bare replay* commits the transactions Roadie "
        "committed, in its order and batch sizes (counted through `Store.write_point`): claim = UPDATE steps + "
        "INSERT placeholders; record = INSERT resources + UPDATE placeholders + UPDATE steps; materialise = INSERT "
        "steps; a claim or requeue that found nothing = an empty write transaction; any other commit = a one-row "
        "UPDATE. *Bare minimum* is one commit before any dispatch and one after "
        f"the answers, per batch of {c}. Median of {args.repeats}.",
        f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()}; database servers on the same machine.",
        "",
        f"Command: {command}",
        "",
        "| database | loop | commits | commits per step | steps/s | µs per step | Roadie ÷ bare time per step "
        "| Roadie's fraction of bare throughput |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        commits = len(r.census.transactions)
        roadie_rate = _rate(steps, r.roadie)
        for label, seconds, n in (
            ("Roadie", r.roadie, commits),
            ("bare replay", r.replay, commits),
            ("bare minimum", r.minimum, 1 + 2 * -(-steps // c)),
        ):
            rate = _rate(steps, seconds)
            vs = "–" if label == "Roadie" else f"{rate / roadie_rate:.2f}"
            share = "–" if label == "Roadie" else f"{roadie_rate / rate:.0%}"
            lines.append(
                f"| {r.backend} | {label} | {n} | {n / steps:.3f} | {rate:.0f} | {1e6 / rate:.0f} | {vs} | {share} |"
            )
    lines += [
        "",
        "Roadie's write transactions in one drain (last repeat), with the rows each kind inserted and updated "
        "(as the driver's row counts say; UPDATE rows are rows matched):",
        "",
        "| database | transaction | commits | steps in them | rows written |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for r in results:
        by_name: dict[str, list[int]] = defaultdict(list)
        for name, n in r.census.transactions:
            by_name[name].append(max(n, 0))
        for name, sizes in by_name.items():
            rows = ", ".join(f"{k}: {v}" for k, v in sorted(r.census.rows[name].items())) or "–"
            lines.append(f"| {r.backend} | `{name}` | {len(sizes)} | {sum(sizes)} | {rows} |")
    lines += [
        "",
        "A ledgered step's placeholder must be durable before the step is dispatched (a worker that dies after "
        "touching the world must leave a row that cleanup can revert by key), and its resources exist only once "
        "it has answered, so no design records ledgered steps with fewer than two commits per batch: one before "
        f"any dispatch and one after the answers, here 2 × {steps} / {c} = {2 * -(-steps // c)}, plus one to "
        "materialise the phase. Roadie's step commits are exactly those two kinds, `claim_steps` (steps claimed "
        "and placeholders inserted) and `record_outcomes` (resources inserted, placeholders resolved, steps "
        "ended); with a no-op module every answer of a batch is in when the drain looks, so its batches are full "
        "and it makes the minimum number of them. The extra commits are the drain looking for more work and "
        "finding none (`claim_steps` with 0 steps, `requeue_expired_claims`) and the run's end (`advance_runs`). "
        "With a slower module whose answers arrive spread out, the drain refills when a quarter of the window is "
        "free and records whatever has answered, so batches shrink and commits per step rise: latency bought "
        "with commits. The gap between Roadie and the bare replay is therefore not commits but the work between "
        "them: the reads each transaction makes (claim's UPDATE … RETURNING, the live-holder check, the drain's "
        "and settle's queries), SQLAlchemy and JSON per row, and the engine's Python per step.",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--postgresql", default=DEFAULT_SERVERS["postgresql"])
    parser.add_argument("--write", type=Path, help="write the results as Markdown to this file")
    args = parser.parse_args(argv)
    freeze_heap()  # as `roadie worker` does once it has started: this process stands in for one
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    home = Path(tempfile.mkdtemp(prefix="roadie-commits-"))
    results = []
    for backend in args.databases:
        server = None
        if backend != "sqlite":
            server = getattr(args, backend)
            problem = _reachable(backend, server)
            if problem:
                print(problem, file=sys.stderr)
                continue
        r = _measure(Database(backend, server, home), args.steps, args.concurrency, args.repeats)
        results.append(r)
        commits = len(r.census.transactions)
        print(
            f"{backend:<10} Roadie {_rate(args.steps, r.roadie):6.0f} steps/s ({commits} commits), "
            f"bare replay {_rate(args.steps, r.replay):6.0f}, bare minimum {_rate(args.steps, r.minimum):6.0f}",
            flush=True,
        )
        print("   ", Counter(name for name, _ in r.census.transactions), flush=True)
    if args.write:
        write_section(args.write, "commit_limit.py", _section(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

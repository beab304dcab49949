"""Roadie's ledgered step throughput against what the database can commit at all.

Three measurements per database, each on a fresh database, median of several repeats:

1. Roadie: one run of N `ledger` steps of an in-process no-op module, drained by one
   engine (`Engine.settle`, FakeClock, concurrency C), as in `throughput.py`. Every write
   transaction is counted through `Store.write_point` (called before each commit; a
   recording that claims the next batch too passes two, one commit), with the rows each
   one inserted and updated (SQLAlchemy's cursor events), and the batch sizes of the
   claims and records.
2. Bare replay: the same driver and engine settings (`roadie.store.dialects.create_engine`:
   for SQLite WAL, synchronous=FULL, BEGIN IMMEDIATE) committing the same transactions in
   the same order with the same batch sizes, as plain INSERTs and UPDATEs on two simple
   tables: a claim is UPDATE steps + INSERT placeholders, a record is INSERT resources +
   UPDATE placeholders + UPDATE steps, a record that claims is both in one commit, a
   materialise is INSERT steps, and every other commit Roadie made (moving the run on,
   ending it) is a one-row UPDATE. No reads.
3. Bare minimum: the strict minimum for ledgered steps, one commit before the first
   dispatch (claim + placeholders) and one after each batch of C answers (resources +
   resolve + end, and the next batch's claim + placeholders), with the same rows.

    .venv/bin/python benchmarks/commit_limit.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/commit_limit.py --quick
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
from report import LoadReport, parse_args, progress, write_section
from sqlalchemy import Column, Insert, Integer, MetaData, String, Table, Update, bindparam, event, insert, update
from sqlalchemy.ext.asyncio import AsyncConnection
from throughput import open_bench
from workers import DEFAULT_SERVERS, Database, _reachable

from roadie.runtime import freeze_heap
from roadie.store import Store
from roadie.store.dialects import create_engine


@dataclass
class Commit:
    name: str  # the write point before the commit; `record_and_claim` for one that passed two
    steps: int  # steps recorded, or materialised
    claimed: int = 0


@dataclass
class Census:
    """What Roadie committed while draining: one entry per write transaction, in order."""

    transactions: list[Commit] = field(default_factory=list)
    rows: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    pending: Counter[str] = field(default_factory=Counter)
    size: int = 0  # steps in the transaction under way, set by the wrapped store methods
    joined: bool = False  # the transaction under way records and claims

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

    def driver_statement(self, sql: str, parameters: Any, many: bool, rowcount: int) -> None:
        """A statement the store gave the driver as text (`store.executemany`)."""
        words = sql.split()
        if words[:2] == ["INSERT", "INTO"]:
            self.pending[f"INSERT {words[2]}"] += len(parameters) if many else 1
        elif words[:1] == ["UPDATE"] and rowcount > 0:
            self.pending[f"UPDATE {words[1]}"] += rowcount

    def commit(self, name: str) -> None:
        if self.joined:
            if name == "record_outcomes":  # the claim's statements follow, in the same transaction
                return
            name = "record_and_claim"
        self.transactions.append(Commit(name, self.size))
        self.rows[name].update(self.pending)
        self.pending.clear()


def _instrument(store: Store, census: Census) -> None:
    @event.listens_for(store.engine.sync_engine, "after_execute")
    def _after(conn: Any, clause: Any, multiparams: Any, params: Any, options: Any, result: Any) -> None:
        census.statement(clause, multiparams, params, result)

    @event.listens_for(store.engine.sync_engine, "after_cursor_execute")
    def _driver(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any, many: bool) -> None:
        if context is not None and context.compiled is None:  # not one `_after` is told of
            census.driver_statement(sql, parameters, many, cursor.rowcount)

    @event.listens_for(store.engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        census.pending.clear()

    store.write_point = census.commit
    claim, record, joined = store.claim_steps, store.record_outcomes, store.record_and_claim
    advance = store.advance_runs

    def claimed(name: str, result: list[Any]) -> None:
        # A claim's size is known only once it returns (one that found nothing still commits).
        if census.transactions and census.transactions[-1].name == name:
            census.transactions[-1].claimed = len(result)
            census.rows[name]["UPDATE steps"] += len(result)

    async def claim_steps(*args: Any, **kwargs: Any) -> Any:
        result = await claim(*args, **kwargs)
        claimed("claim_steps", result)
        return result

    async def record_and_claim(outcomes: list[Any], *args: Any, **kwargs: Any) -> Any:
        census.size, census.joined = len(outcomes), True
        try:
            result = await joined(outcomes, *args, **kwargs)
        finally:
            census.size, census.joined = 0, False
        claimed("record_and_claim", result)
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
    store.record_and_claim = record_and_claim  # type: ignore[method-assign]
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


async def _claim(conn: AsyncConnection, ids: list[int]) -> None:
    if not ids:
        return
    await conn.execute(
        update(bare_steps)
        .where(bare_steps.c.id.in_(ids))
        .values(status="running", claimed_by="bare", attempts=bare_steps.c.attempts + 1)
    )
    rows = [{"step_id": i, "kind": "@step", "ref": f"key-{i}", "state": "pending"} for i in ids]
    await conn.execute(insert(bare_resources), rows)


async def _record(conn: AsyncConnection, ids: list[int]) -> None:
    if not ids:
        return
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
        await self._tx(lambda conn: _claim(conn, ids))

    async def record(self, ids: list[int]) -> None:
        await self._tx(lambda conn: _record(conn, ids))

    async def record_and_claim(self, recorded: list[int], claimed: list[int]) -> None:
        async def work(conn: AsyncConnection) -> None:
            await _record(conn, recorded)
            await _claim(conn, claimed)

        await self._tx(work)

    async def other(self) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(update(bare_runs).where(bare_runs.c.id == 1).values(ticks=bare_runs.c.ticks + 1))

        await self._tx(work)


async def _bare(url: str, plan: list[Commit]) -> float:
    """Commit `plan` (`_replay_plan`'s or `_minimum_plan`'s kinds) as plain writes."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(bare.create_all)
            await conn.execute(insert(bare_runs), [{"id": 1, "ticks": 0}])
        loop = Bare(engine.connect)
        ready: list[int] = []
        running: list[int] = []
        started = time.perf_counter()
        for commit in plan:
            if commit.name == "materialise":
                ready.extend(await loop.materialise(commit.steps))
                continue
            recorded, running = running[: commit.steps], running[commit.steps :]
            claimed, ready = ready[: commit.claimed], ready[commit.claimed :]
            if commit.name == "claim":
                await loop.claim(claimed)
            elif commit.name == "record":
                await loop.record(recorded)
            elif commit.name == "record and claim":
                await loop.record_and_claim(recorded, claimed)
            elif commit.name == "empty":
                await loop.claim([])  # a write transaction that finds nothing to change
            else:
                await loop.other()
            running.extend(claimed)
        elapsed = time.perf_counter() - started
        assert not ready, len(ready)
        assert not running, len(running)
        return elapsed
    finally:
        await engine.dispose()


def _replay_plan(census: Census) -> list[Commit]:
    plan = []
    for c in census.transactions:
        if c.name == "materialise_phase" and c.steps > 0:
            plan.append(Commit("materialise", c.steps))
        elif c.name == "claim_steps" and c.claimed > 0:
            plan.append(Commit("claim", 0, c.claimed))
        elif c.name in ("claim_steps", "requeue_expired_claims"):
            plan.append(Commit("empty", 0))
        elif c.name == "record_outcomes":
            plan.append(Commit("record", c.steps))
        elif c.name == "record_and_claim":
            plan.append(Commit("record and claim", c.steps, c.claimed))
        else:
            plan.append(Commit("other", 0))
    return plan


def _minimum_plan(steps: int, batch: int) -> list[Commit]:
    sizes = [min(batch, steps - start) for start in range(0, steps, batch)]
    plan = [Commit("materialise", steps), Commit("claim", 0, sizes[0])]
    plan += [Commit("record and claim", n, after) for n, after in zip(sizes, [*sizes[1:], 0], strict=True)]
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
    for i in range(repeats):
        piece = f"{db.backend}, repeat {i + 1}/{repeats}"
        url = db.fresh()
        try:
            seconds, census = asyncio.run(_roadie(url, steps, concurrency))
        finally:
            db.drop()
        result.roadie.append(seconds)
        result.census = census
        progress("commit_limit", f"{piece}: Roadie {seconds:.3f} s, {len(census.transactions)} commits")
        for label, plan, into in (
            ("bare replay", _replay_plan(census), result.replay),
            ("bare minimum", _minimum_plan(steps, concurrency), result.minimum),
        ):
            url = db.fresh()
            try:
                into.append(asyncio.run(_bare(url, plan)))
            finally:
                db.drop()
            progress("commit_limit", f"{piece}: {label} {into[-1]:.3f} s, {len(plan)} commits")
    shutil.rmtree(db.home, ignore_errors=True)
    return result


def _rate(steps: int, seconds: list[float]) -> float:
    return steps / statistics.median(seconds)


def _section(results: list[Result], args: argparse.Namespace, load: str) -> str:
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
        "INSERT placeholders; record = INSERT resources + UPDATE placeholders + UPDATE steps; record and claim = "
        "both in one commit; materialise = INSERT steps; a claim or requeue that found nothing = an empty write "
        "transaction; any other commit = a one-row UPDATE. *Bare minimum* is one commit before the first dispatch "
        f"(claim) and one after each batch of {c} answers (record and claim the next batch). "
        f"Median of {args.repeats}.",
        f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()}; database servers on the same machine.",
        "",
        load,
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
            ("bare minimum", r.minimum, 2 + -(-steps // c)),
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
        "| database | transaction | commits | steps recorded or materialised | steps claimed | rows written |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        by_name: dict[str, list[Commit]] = defaultdict(list)
        for commit in r.census.transactions:
            by_name[commit.name].append(commit)
        for name, commits in by_name.items():
            rows = ", ".join(f"{k}: {v}" for k, v in sorted(r.census.rows[name].items())) or "–"
            done, taken = sum(c.steps for c in commits), sum(c.claimed for c in commits)
            lines.append(f"| {r.backend} | `{name}` | {len(commits)} | {done} | {taken} | {rows} |")
    lines += [
        "",
        "A ledgered step's placeholder must be durable before the step is dispatched (a worker that dies after "
        "touching the world must leave a row that cleanup can revert by key), and its resources exist only once "
        "it has answered, so no design records a batch of ledgered steps with fewer than one commit before its "
        "dispatch and one after its answers; the commit after one batch's answers can be the one before the "
        f"next's dispatch, so the least is one commit per batch and one more: here {steps} / {c} + 1 = "
        f"{-(-steps // c) + 1}, plus one to materialise the phase. Roadie's step commits are those kinds: "
        "`claim_steps` (steps claimed and placeholders inserted), `record_outcomes` (resources inserted, "
        "placeholders resolved, steps ended) and `record_and_claim` (both, in one commit); with a no-op module "
        "every answer of a batch is in when the drain looks, so its batches are full and it makes the minimum "
        "number of them. The extra commits are the drain looking for more work and finding none (`claim_steps` "
        "with 0 steps, `requeue_expired_claims`) and the run's end (`advance_runs`). With a slower module whose "
        "answers arrive spread out, the drain refills when a quarter of the window is free and records whatever "
        "has answered, so batches shrink and commits per step rise: latency bought with commits. The gap "
        "between Roadie and the bare replay is therefore not commits but the work between them: the reads each "
        "transaction makes (claim's UPDATE … RETURNING, the live-holder check, the drain's and settle's "
        "queries), SQLAlchemy and JSON per row, and the engine's Python per step.",
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
    args = parse_args(parser, argv, quick={"steps": 200, "repeats": 1, "databases": ["sqlite"]})
    load = LoadReport("commit_limit")
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
        print("   ", Counter(c.name for c in r.census.transactions), flush=True)
    load_line = load.end()
    print(load_line)
    if args.write:
        write_section(args.write, "commit_limit.py", _section(results, args, load_line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What a claim costs as the queue of ready steps grows: 1,000, 10,000 and 50,000 steps.

Each queue length gets a fresh database: runs of 100 `bench.ledger` steps are created and
their phase materialised (every step ready, none claimed), and then the drain's claim of
100 steps (`Store.claim_steps`, the claim and the placeholders it reserves, one commit) is
timed ten times in a row, each taking the next hundred. What is reported is the median
claim, and its ratio to the claim from the shortest queue in the same run: a claim that
reads only the steps it takes costs the same whatever waits behind them (ratio about 1);
one that reads the whole queue costs more with every step waiting.

    .venv/bin/python benchmarks/claim_queue.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/claim_queue.py --databases postgresql --queues 1000 100000
    .venv/bin/python benchmarks/claim_queue.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from report import LoadReport, parse_args, progress, write_section
from throughput import open_bench
from workers import DEFAULT_SERVERS, Database, _reachable

from roadie.runtime import freeze_heap
from roadie.store import mint_token

STEPS_PER_RUN = 100
CLAIMS = 10
TAKEN = 100


async def _claims(url: str, queue: int) -> list[float]:
    """Seconds for each of `CLAIMS` claims of `TAKEN` steps from a queue of `queue` ready steps."""
    store, engine, event = await open_bench(url, "ledger", STEPS_PER_RUN, TAKEN)
    try:
        await engine.start_runs(event, [{}] * (queue // STEPS_PER_RUN))
        await engine._advance()  # every run's phase materialised: `queue` ready steps
        seconds = []
        for _ in range(CLAIMS):
            started = time.perf_counter()
            claimed = await store.claim_steps("bench", engine.clock.now(), TAKEN, 60.0, token=mint_token("bench"))
            seconds.append(time.perf_counter() - started)
            assert len(claimed) == TAKEN
        return seconds
    finally:
        await store.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--databases", default="sqlite,postgresql,mariadb")
    parser.add_argument("--postgresql", default=os.environ.get("ROADIE_TEST_POSTGRESQL", DEFAULT_SERVERS["postgresql"]))
    parser.add_argument("--mariadb", default=os.environ.get("ROADIE_TEST_MARIADB", DEFAULT_SERVERS["mariadb"]))
    parser.add_argument("--queues", type=int, nargs="+", default=[1000, 10000, 50000], help="ready steps, shortest 1st")
    parser.add_argument("--write", type=Path, help="write (or replace) this script's section in this Markdown file")
    args = parse_args(parser, argv, quick={"databases": "sqlite", "queues": [1000, 5000]})
    freeze_heap()
    logging.disable(logging.CRITICAL)  # the store's close-time chatter, not what is measured
    load = LoadReport("claim_queue")
    rows: list[tuple[str, int, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in [b.strip() for b in args.databases.split(",") if b.strip()]:
            server = None if backend == "sqlite" else getattr(args, backend)
            if server is not None and (problem := _reachable(backend, server)):
                print(f"skipped: {problem}", file=sys.stderr)
                continue
            db = Database(backend, server, Path(tmp))
            shortest: float | None = None
            for queue in args.queues:
                url = db.fresh()
                try:
                    median = statistics.median(asyncio.run(_claims(url, queue)))
                finally:
                    db.drop()
                shortest = shortest or median
                rows.append((backend, queue, median, median / shortest))
                progress("claim_queue", f"{backend}, {queue} ready steps: {median * 1000:.2f} ms a claim")
    for backend, queue, median, ratio in rows:
        print(f"{backend:<10} {queue:>7} ready  {median * 1000:7.2f} ms a claim of {TAKEN}  {ratio:.2f}x the shortest")
    env = (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}; database servers on the same machine."
    )
    load_line = load.end()
    print(load_line)
    if args.write:
        lines = [
            "## A claim as the queue grows",
            "",
            f"The drain's claim of {TAKEN} steps (`Store.claim_steps`: the claim, the placeholders it "
            f"reserves, one commit), timed {CLAIMS} times in a row on a queue of ready steps (runs of "
            f"{STEPS_PER_RUN} `bench.ledger` steps, their phase materialised, nothing claimed yet), a fresh "
            "database for each length; the median claim, and its ratio to the shortest queue's. " + env,
            "",
            load_line,
            "",
            "Command: `.venv/bin/python benchmarks/claim_queue.py --write docs/benchmarks.md`",
            "",
            "| database | ready steps | ms a claim (median) | ratio to the shortest queue |",
            "| --- | ---: | ---: | ---: |",
            *(f"| {b} | {q:,} | {m * 1000:.2f} | {r:.2f} |" for b, q, m, r in rows),
        ]
        write_section(args.write, "claim_queue.py", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

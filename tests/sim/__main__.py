"""Run the simulation from a shell and print its figures.

python -m tests.sim --seeds 100 --backend sqlite
python -m tests.sim --backend sqlite --seed 17 --trace     # replay one seed, with its trace
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.sim.databases import SeedDatabases
from tests.sim.figures import Figures
from tests.sim.simulation import EVENTS, STEPS, quiet_logging, run_seed

PROGRESS_EVERY = 60.0  # seconds between lines saying how far a batch has gone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds, from --first")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, default=None, help="run this one seed only (a replay)")
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgresql", "mariadb"])
    parser.add_argument("--steps", type=int, default=STEPS, help="random scheduler steps per seed")
    parser.add_argument(
        "--events", default=",".join(EVENTS), help=f"the events runs are started of (default {','.join(EVENTS)})"
    )
    parser.add_argument(
        "--no-fences", action="store_true", help="the world takes calls under stale fences (to count what they stop)"
    )
    parser.add_argument("--trace", action="store_true", help="print each failing seed's whole trace")
    parser.add_argument("--report", type=Path, default=None, help="append the figures as a JSON line here")
    args = parser.parse_args(argv)
    quiet_logging()
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
    figures = Figures(args.backend)
    began = said = time.monotonic()
    with tempfile.TemporaryDirectory() as home:
        databases = SeedDatabases(args.backend, Path(home))
        try:
            for seed in seeds:
                result = run_seed(seed, databases, args.steps, tuple(args.events.split(",")), fences=not args.no_fences)
                figures.add(result)
                if result.violations:
                    print(result.describe(tail=10**6 if args.trace else 40), file=sys.stderr)
                if time.monotonic() - said >= PROGRESS_EVERY:  # thousands of seeds take hours
                    said = time.monotonic()
                    print(figures.progress(len(seeds), said - began), flush=True)
        finally:
            databases.close()
    figures.seconds = time.monotonic() - began
    print(figures.table())
    if args.report is not None:
        with args.report.open("a") as out:
            out.write(json.dumps(figures.as_dict()) + "\n")
    return 1 if figures.violated else 0


if __name__ == "__main__":
    sys.exit(main())

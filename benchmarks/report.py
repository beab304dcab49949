"""What every benchmark shares: its section of docs/benchmarks.md (each rewrites only its
own), the progress it prints as it goes, the load it ran under, and its `--quick` sizes."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TITLE = """# Benchmarks

Figures from real runs on this kind of machine; each section names the command that made it.

Every benchmark prints a line to stderr as each measured piece ends, and takes `--quick`
(see its `--help`): the same measurements at their smallest sizes, in under a minute, to
try it or check it works; a quick run writes nothing here. Each prints the machine's load
(the 1-, 5- and 15-minute load averages and the CPU count) at its start and at its end, and
a section written since then carries them in its "Load average" line: these machines are
shared, and a figure means little without the load it was measured under. Sections
without that line were written before it existed.
"""


def markers(script: str) -> tuple[str, str]:
    return f"<!-- benchmarks/{script}: begin -->", f"<!-- benchmarks/{script}: end -->"


def write_section(path: Path, script: str, body: str) -> None:
    """Put `body` between `script`'s markers in `path`, replacing what was there."""
    begin, end = markers(script)
    section = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else TITLE
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def progress(script: str, message: str) -> None:
    """One short line to stderr, at once: a long run on a busy machine shows what it is doing
    (the remote fan-out once printed nothing for seven minutes)."""
    print(f"{script}: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Load:
    """The 1-, 5- and 15-minute load averages and the CPU count, at one moment."""

    averages: tuple[float, float, float]
    cpus: int | None

    @classmethod
    def now(cls) -> Load:
        return cls(os.getloadavg(), os.cpu_count())

    def __str__(self) -> str:
        return ", ".join(f"{x:.2f}" for x in self.averages) + f" on {self.cpus} CPUs"


class LoadReport:
    """The load a benchmark ran under: taken (and printed) when made and when `end` is called."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.started = Load.now()
        self.ended: Load | None = None
        progress(script, f"load average (1, 5, 15 min) at the start: {self.started}")

    def end(self) -> str:
        """Take the load at the end, print it, and return the line for the section."""
        self.ended = Load.now()
        progress(self.script, f"load average (1, 5, 15 min) at the end: {self.ended}")
        return self.line()

    def line(self) -> str:
        end = "not taken" if self.ended is None else str(self.ended)
        return f"Load average (1, 5, 15 min): {self.started} at the start, {end} at the end."


def parse_args(parser: argparse.ArgumentParser, argv: list[str], quick: dict[str, Any]) -> argparse.Namespace:
    """`parser`'s arguments, with `--quick`: the sizes in `quick` instead of the defaults
    (an option given on the command line still wins). A quick run is a try, not a figure
    for the docs, so it refuses `--write`."""
    sizes = " ".join(f"--{k.replace('_', '-')} {_shown(v)}" for k, v in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"the smallest sizes, under a minute, no --write: {sizes}")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
        if getattr(args, "write", None):
            parser.error("--quick makes no figures for the docs: leave out --write, or give the sizes yourself")
    return args


def _shown(value: Any) -> str:
    return " ".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)

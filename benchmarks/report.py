"""What every benchmark shares: its section of docs/benchmarks.md (each rewrites only its
own), the progress it prints as it goes, the load it ran under, and its `--quick` sizes."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
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


# The standard contention (`--contention`): one process per CPU spinning on arithmetic, and
# one process writing 4 KiB to a file of its own and fsyncing it, again and again. Each is a
# few lines of Python started with the benchmark's own interpreter, so any machine that runs
# the benchmark can make the same load; each says on stdout how much it did when stopped.
_SPIN = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
started, n, x = time.perf_counter(), 0, 1
while not stop:
    for i in range(10_000):
        x = (x * 31 + i) % 1_000_003
    n += 10_000
print(n / (time.perf_counter() - started))
"""
_FSYNC = """
import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
block, n, started = b"x" * 4096, 0, time.perf_counter()
while not stop:
    os.pwrite(fd, block, (n % 256) * 4096)
    os.fsync(fd)
    n += 1
os.close(fd)
print(n / (time.perf_counter() - started))
"""


class Contention:
    """The standard background load of `--contention`, on while a benchmark times both
    sides alike: `spinners` CPU-bound processes (one per CPU unless told) and one process
    doing small fsync'd writes in a loop to a temp file. `start` starts them, `stop` stops
    them (a `with` block does both) and returns the line that says what ran: the load
    average just before they were stopped, and how fast they went."""

    def __init__(self, script: str, spinners: int | None = None) -> None:
        self.script = script
        self.spinners = spinners if spinners is not None else os.cpu_count() or 1
        self._procs: list[subprocess.Popen[str]] = []
        self._home: tempfile.TemporaryDirectory[str] | None = None
        self.line = ""

    def start(self) -> None:
        self._home = tempfile.TemporaryDirectory(prefix="roadie-contention-")
        target = os.path.join(self._home.name, "fsync.dat")
        argvs = [[sys.executable, "-c", _SPIN] for _ in range(self.spinners)] + [[sys.executable, "-c", _FSYNC, target]]
        self._procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for argv in argvs]
        self.started = time.perf_counter()
        progress(self.script, f"contention on: {self.spinners} CPU-bound processes, 1 fsync writer")

    def stop(self) -> str:
        """Stop the load and return the line describing it."""
        if not self._procs:
            return self.line
        load = Load.now()
        for proc in self._procs:
            proc.send_signal(signal.SIGTERM)
        rates = []
        for proc in self._procs:
            try:
                out, _ = proc.communicate(timeout=10)
                rates.append(float(out.strip() or 0))
            except (subprocess.TimeoutExpired, ValueError):
                proc.kill()
                proc.wait()
                rates.append(0.0)
        self._procs = []
        if self._home is not None:
            self._home.cleanup()
        spin, fsyncs = rates[:-1], rates[-1]
        minutes = (time.perf_counter() - self.started) / 60
        self.line = (
            f"Contention (`--contention`, started by the benchmark, on for {minutes:.1f} min over every "
            f"measurement of both sides): {self.spinners} CPU-bound Python processes "
            f"({sum(spin) / len(spin) / 1e6:.1f} M loop steps/s each on average) and 1 process writing 4 KiB "
            f"and fsyncing it in a loop ({fsyncs:.0f} fsyncs/s); load average (1, 5, 15 min) under it, just "
            f"before it was stopped: {load}."
        )
        progress(self.script, self.line)
        return self.line

    def __enter__(self) -> Contention:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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

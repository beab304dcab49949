"""How soon the command line answers: `roadie --help`, `roadie --version`, `roadie run
--help` and `roadie run list` (on a fresh SQLite database, made with `roadie init` first),
each a whole process, against the floor `python -c pass` on the same interpreter.

Each command is run `--runs` times, alternated with the floor (floor, command, floor,
command...), after one run of each that is not counted (it writes what Python caches).
Each process's CPU time (user + system, from `os.wait4`) and its wall time are taken; the
figures are the medians, in seconds and as a multiple of the floor's. CPU time is what
counts: the machine is shared, and wall time moves with whatever else runs on it (the load
average is printed, and written, before and after). The aims: `--help` and `--version`
under 0.2 s of CPU, `run list` under 0.4 s.

    .venv/bin/python benchmarks/cli_startup.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/cli_startup.py --quick
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import LoadReport, parse_args, progress, write_section

# The command, and the CPU seconds it should stay under (None: no aim, shown for comparison).
COMMANDS: list[tuple[list[str], float | None]] = [
    (["--help"], 0.2),
    (["--version"], 0.2),
    (["run", "--help"], None),
    (["run", "list"], 0.4),
]


# As a user's Python runs: writing the bytecode caches (the run not counted writes them),
# whatever this shell says (a PYTHONDONTWRITEBYTECODE has every run compile again each
# module whose cache is missing or old).
CACHING = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def roadie() -> list[str]:
    """The `roadie` script beside this interpreter, as a user runs it."""
    script = Path(sys.executable).parent / "roadie"
    return [str(script)] if script.exists() else [sys.executable, "-m", "roadie.cli.main"]


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """One run of `argv`: its CPU seconds (user + system) and its wall seconds."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, env=CACHING, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.stderr is not None
    errors = process.stderr.read().decode()
    process.stderr.close()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {process.returncode}: {errors}")
    return usage.ru_utime + usage.ru_stime, wall


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each command, and of the floor beside it")
    parser.add_argument("--write", type=Path, help="write the results as Markdown to this file")
    args = parse_args(parser, argv, quick={"runs": 2})

    floor_argv = [sys.executable, "-c", "pass"]
    load = LoadReport("cli_startup")
    progress("cli_startup", f"{args.runs} runs of each, alternated with `python -c pass`")
    with tempfile.TemporaryDirectory(prefix="roadie-cli-") as tmp:
        home = Path(tmp)
        timed([*roadie(), "init"], home)
        floor: list[tuple[float, float]] = []
        figures: dict[str, list[tuple[float, float]]] = {}
        for command, _ in COMMANDS:
            label = " ".join(["roadie", *command])
            argv_ = [*roadie(), *command]
            timed(floor_argv, home), timed(argv_, home)  # not counted: Python writes its caches
            figures[label] = []
            for i in range(args.runs):
                floor.append(timed(floor_argv, home))
                figures[label].append(timed(argv_, home))
                cpu, wall = figures[label][-1]
                progress(
                    "cli_startup",
                    f"{label}, run {i + 1}/{args.runs}: {cpu:.3f} s CPU, {wall:.3f} s wall "
                    f"(python -c pass: {floor[-1][0]:.3f} s CPU, {floor[-1][1]:.3f} s wall)",
                )
    load_line = load.end()
    floor_cpu = statistics.median(c for c, _ in floor)
    floor_wall = statistics.median(w for _, w in floor)
    rows = [("python -c pass", floor_cpu, floor_wall, None)]
    for (_, aim), (label, runs) in zip(COMMANDS, figures.items(), strict=True):
        rows.append((label, statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs), aim))
    print(load_line)
    for label, cpu, wall, aim in rows:
        verdict = "" if aim is None else (f"  aim < {aim} s: " + ("met" if cpu < aim else "MISSED"))
        ratios = f"CPU {cpu:.3f} s ({cpu / floor_cpu:.1f}x)  wall {wall:.3f} s ({wall / floor_wall:.1f}x)"
        print(f"{label:<28} {ratios}{verdict}")
    if args.write:
        lines = [
            "## The command line: how soon it answers",
            "",
            "Each command a whole process, started as a user starts it (the `roadie` script of the virtual "
            "environment), in a temporary folder whose SQLite database `roadie init` made first (so `run list` "
            f"reads an empty one); {args.runs} runs of each, alternated with `python -c pass` on the same "
            "interpreter (the floor), after one run of each not counted; CPU time is the process's user + "
            "system time (`os.wait4`), the medians of the runs, and a multiple of the floor's. "
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.system()}.",
            "",
            load_line,
            "",
            f"Command: `.venv/bin/python benchmarks/cli_startup.py --write {args.write}`",
            "",
            "| command | CPU s | CPU / floor | wall s | wall / floor | aim (CPU) |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for label, cpu, wall, aim in rows:
            verdict = "" if aim is None else f"< {aim} s: " + ("met" if cpu < aim else "**missed**")
            name = f"`{label}`" + (" (the floor)" if label == "python -c pass" else "")
            cells = [name, f"{cpu:.3f}", f"{cpu / floor_cpu:.1f}×", f"{wall:.3f}", f"{wall / floor_wall:.1f}×"]
            lines.append("| " + " | ".join([*cells, verdict]) + " |")
        write_section(args.write, "cli_startup.py", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

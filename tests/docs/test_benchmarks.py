"""The benchmarks as someone trying one runs them: each says in `--help` how to run it small,
prints what it is doing as it goes, and reports the load it ran under (issue 39, item 4)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = [
    "throughput.py",
    "workers.py",
    "cleanup_scaling.py",
    "commit_limit.py",
    "web_latency.py",
    "remote.py",
    "dbos_compare.py",
    "cli_startup.py",
    "claim_queue.py",
]
LOAD = r"\d+\.\d\d, \d+\.\d\d, \d+\.\d\d on \d+ CPUs"


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_every_benchmark_that_writes_the_docs_is_checked_here() -> None:
    """A new benchmark that writes a section of docs/benchmarks.md joins the list above."""
    writers = {p.name for p in (ROOT / "benchmarks").glob("*.py") if "write_section(" in p.read_text()}
    assert writers - {"report.py"} == set(BENCHMARKS)


@pytest.mark.parametrize("script", BENCHMARKS)
def test_each_benchmark_says_in_its_help_how_to_run_it_small(script: str) -> None:
    """Every benchmark's `--help` offers `--quick` and names the sizes it runs at."""
    done = _run(script, "--help")
    assert done.returncode == 0, done.stderr
    help_text = " ".join(done.stdout.split())
    assert "--quick" in help_text
    assert re.search(r"--quick the smallest sizes, under a minute, no --write: --[a-z]", help_text), help_text


def test_a_small_run_prints_each_piece_and_the_load_and_writes_the_load(tmp_path: Path) -> None:
    """throughput.py at its smallest, end to end: a progress line on stderr for each of its
    four measured pieces, the load at the start and at the end, and the section it writes
    holds its table and the load line."""
    docs = tmp_path / "benchmarks.md"
    done = _run("throughput.py", "--steps", "10", "--runs", "2", "--repeats", "1", "--write", str(docs))
    assert done.returncode == 0, done.stderr
    pieces = re.findall(r"^throughput: (none|ledger), .+, repeat 1/1: \d+ steps/s$", done.stderr, re.M)
    assert pieces == ["none", "none", "ledger", "ledger"], done.stderr
    assert re.search(rf"^throughput: load average \(1, 5, 15 min\) at the start: {LOAD}$", done.stderr, re.M)
    assert re.search(rf"^throughput: load average \(1, 5, 15 min\) at the end: {LOAD}$", done.stderr, re.M)
    section = docs.read_text()
    load_line = rf"^Load average \(1, 5, 15 min\): {LOAD} at the start, {LOAD} at the end\.$"
    assert re.search(load_line, section, re.M), section
    assert re.search(load_line, done.stdout, re.M), done.stdout
    assert section.count("| `none` |") == 2, section
    assert section.count("| `ledger` |") == 2, section


def test_a_quick_run_refuses_to_write_the_docs(tmp_path: Path) -> None:
    """A quick run's figures are a try, not the docs' figures: `--quick --write` is refused."""
    done = _run("throughput.py", "--quick", "--write", str(tmp_path / "benchmarks.md"))
    assert done.returncode == 2
    assert "--quick" in done.stderr
    assert not (tmp_path / "benchmarks.md").exists()


def test_the_docs_head_is_the_one_a_benchmark_writes_on_a_fresh_file() -> None:
    """docs/benchmarks.md opens with the head benchmarks/report.py writes into a new file,
    which says how to make a quick run and where the load is reported."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from report import TITLE
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert (ROOT / "docs" / "benchmarks.md").read_text().startswith(TITLE)
    assert "--quick" in TITLE
    assert "load averages" in TITLE


def test_the_standard_contention_runs_until_stopped_and_says_what_it_did() -> None:
    """`--contention`'s load (report.Contention): CPU-bound processes and an fsync writer,
    running while the benchmark times, gone once stopped, and a line that says how much
    each did and the load average under them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from report import Contention
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    contention = Contention("test", spinners=1)
    contention.start()
    procs = list(contention._procs)
    assert len(procs) == 2
    try:
        time.sleep(1.0)
        assert all(p.poll() is None for p in procs), "the load runs until stopped"
    finally:
        line = contention.stop()
    assert all(p.poll() is not None for p in procs), "stopped, every process is gone"
    assert re.search(r"1 CPU-bound Python processes \(\d+\.\d M loop steps/s", line), line
    assert re.search(r"fsyncing it in a loop \((\d+) fsyncs/s\)", line), line
    assert int(re.search(r"\((\d+) fsyncs/s\)", line).group(1)) > 0, line  # type: ignore[union-attr]
    assert re.search(LOAD, line), line

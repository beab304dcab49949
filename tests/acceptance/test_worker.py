"""`roadie worker` in its own process picks up runs that `roadie run start` creates."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from roadie.engine.verify import LATE_AFTER
from tests.acceptance.test_cli import QUICK_EVENT


def roadie(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "roadie.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "120"},
    )


def test_a_worker_process_carries_out_a_run_and_stops_on_sigterm(tmp_path: Path) -> None:
    """A run started without --wait is carried out and cleaned up by a separate worker
    process, which `roadie workers` lists as alive; SIGTERM stops the worker cleanly
    (exit 0), and it is then listed as stopped, holding nothing."""
    (tmp_path / "quick.yaml").write_text(QUICK_EVENT)
    assert roadie(tmp_path, "init").returncode == 0
    worker = subprocess.Popen(
        [sys.executable, "-m", "roadie.cli.main", "worker", "--concurrency", "4"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = roadie(tmp_path, "run", "start", "quick.yaml", "--json")
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["id"]
        deadline = time.monotonic() + 30
        run: dict[str, object] = {}
        while time.monotonic() < deadline:
            shown = roadie(tmp_path, "run", "show", str(run_id), "--json")
            run = json.loads(shown.stdout)["run"]
            if run["status"] == "succeeded" and run["cleanup_status"] == "complete":
                break
            time.sleep(0.3)
        assert (run["status"], run["cleanup_status"]) == ("succeeded", "complete")
        world = json.loads(roadie(tmp_path, "sandbox", "show", "--json").stdout)
        assert world["creatures"] == {}
        assert world["regions"]["yew"] == "clear"
        [alive] = json.loads(roadie(tmp_path, "workers", "--json").stdout)
        assert (alive["state"], alive["pid"], alive["concurrency"]) == ("alive", worker.pid, 4)
        table = roadie(tmp_path, "workers").stdout
        assert alive["worker_id"] in table
        assert "alive" in table
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    [stopped] = json.loads(roadie(tmp_path, "workers", "--json").stdout)
    assert stopped["worker_id"] == alive["worker_id"]
    assert (stopped["state"], stopped["steps"], stopped["cleanups"]) == ("stopped", 0, 0)
    assert stopped["stopped_at"] is not None


def _show(cwd: Path, run_id: int) -> dict[str, Any]:
    shown = roadie(cwd, "run", "show", str(run_id), "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def _until(what: str, check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _ends_at(cwd: Path, run_id: int) -> str | None:
    """Read straight from the database file: quick enough to kill the worker well before
    the end it has just set (a `roadie run show` takes most of a second)."""
    with sqlite3.connect(cwd / "roadie.db") as db:
        row = db.execute("SELECT ends_at FROM runs WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]


def test_a_run_that_ended_while_no_worker_was_alive_is_torn_down_by_the_next(tmp_path: Path) -> None:
    """On the real clock: the only worker is killed while a run holds for its duration;
    its end passes with no worker alive. The next worker to start ends it, cleans it up
    and restores the weather, and the report says how late the end came."""
    held = QUICK_EVENT.replace("cleanup: auto", "cleanup: auto\nduration: 8s")
    (tmp_path / "held.yaml").write_text(held)
    assert roadie(tmp_path, "init").returncode == 0

    def start_worker() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "roadie.cli.main", "worker"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    first = start_worker()
    try:
        started = roadie(tmp_path, "run", "start", "held.yaml", "--json")
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["id"]
        _until("the run to hold", lambda: _ends_at(tmp_path, run_id) is not None, seconds=120)
    finally:
        first.kill()
        first.wait(30)
    ends_at = datetime.fromisoformat(_show(tmp_path, run_id)["run"]["ends_at"])
    assert _show(tmp_path, run_id)["run"]["status"] == "running"
    # The end passes, and then some, with nobody to see it.
    _until("the run's end to be long past", lambda: datetime.now(UTC) > ends_at + timedelta(seconds=LATE_AFTER + 1))
    assert json.loads(roadie(tmp_path, "sandbox", "show", "--json").stdout)["regions"]["yew"] == "fog"

    second = start_worker()
    try:
        _until("the next worker's teardown", lambda: _show(tmp_path, run_id)["run"]["cleanup_status"] == "complete")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    run = _show(tmp_path, run_id)["run"]
    assert run["status"] == "succeeded"
    report = run["cleanup_report"]
    assert report["verdict"] == "verified_clean"
    late = {e["what"]: e["late_s"] for e in report["late"]}
    assert late["run end"] > LATE_AFTER
    world = json.loads(roadie(tmp_path, "sandbox", "show", "--json").stdout)
    assert (world["creatures"], world["regions"]["yew"]) == ({}, "clear")
    shown = roadie(tmp_path, "run", "show", str(run_id)).stdout
    assert "late run end" in shown

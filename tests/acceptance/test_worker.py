"""`roadie worker` in its own process picks up runs that `roadie run start` creates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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

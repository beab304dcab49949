"""`roadie demo`, the main job, end to end in its own process, as `make demo` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_restores_the_world_and_says_so(tmp_path: Path) -> None:
    """The demo runs the invasion with a lost answer and retried failures, cleans up, and
    exits 0 only because the world after cleanup equals the world before the run."""
    result = subprocess.run(
        [sys.executable, "-m", "roadie.cli.main", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "after cleanup the world equals the world before the run" in out
    assert "retrying under the same key" in out  # the faults really happened
    assert "orc warband: 2 attempts" in out
    assert "war chest: 3 attempts" in out
    assert (tmp_path / "roadie.db").exists()
    assert (tmp_path / "sandbox.db").exists()

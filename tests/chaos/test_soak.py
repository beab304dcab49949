"""The random-fault soak (tests/chaos/soak.py) at the suite's size: `--soak-runs N`."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.chaos.soak import soak
from tests.databases import Database


@pytest.mark.chaos
@pytest.mark.timeout(3600)
def test_soak_of_runs_under_random_faults_loses_nothing(database: Database, tmp_path: Path, soak_runs: int) -> None:
    """Runs in batches under random module faults, duplicate deliveries, failing reverts
    and engine crashes: every batch's world is restored, no resource is lost, nothing is
    reverted twice."""
    url = database.fresh(tmp_path)
    try:
        report = asyncio.run(soak(url, str(tmp_path / "world.db"), soak_runs, seed=20261202, backend=database.backend))
    finally:
        database.drop_all()
    print(json.dumps(asdict(report)))
    path = os.environ.get("ROADIE_CHAOS_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"suite": "soak", **asdict(report)}) + "\n")
    assert report.problems == []
    assert report.resources_lost == 0
    assert report.objects_removed_twice == 0
    assert report.worlds_restored == report.batches
    assert report.runs == soak_runs
    assert sum(report.faults.values()) > 0, "no fault was injected: the soak proved nothing"

"""A run's server-sent events send every step once, then only the steps that changed."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from roadie.web.live import run_events


class _Changing:
    """A store whose run moves one step at a time, and a broker that never waits."""

    def __init__(self, steps: int) -> None:
        self.statuses = ["ready"] * steps
        self.looks = 0

    async def get_run(self, run_id: int) -> Any:
        done = all(s == "succeeded" for s in self.statuses)
        return SimpleNamespace(
            id=run_id,
            status="succeeded" if done else "running",
            cleanup_status="not_required",
            cleanup_policy="manual",
            cleanup_attempts=0,
            phase=0,
            cancel_requested=False,
            cleanup_ended_at=None,
        )

    async def list_steps(self, run_id: int) -> list[Any]:
        self.looks += 1
        if self.looks > 1 and "ready" in self.statuses:  # each look finds the next step done
            self.statuses[self.statuses.index("ready")] = "succeeded"
        return [SimpleNamespace(id=i, status=s, attempts=1) for i, s in enumerate(self.statuses)]

    async def wait(self, run_id: int, poll: float) -> None:
        await asyncio.sleep(0)


def test_a_run_event_after_the_first_names_only_the_steps_that_changed() -> None:
    async def events() -> list[tuple[str, Any]]:
        changing = _Changing(1000)
        seen = []
        async for chunk in run_events(changing, changing, 7, poll=0.01):  # type: ignore[arg-type]
            if chunk.startswith("event: "):
                name, _, data = chunk[len("event: ") :].partition("\ndata: ")
                seen.append((name, json.loads(data)))
        return seen

    seen = asyncio.run(events())
    runs = [data for name, data in seen if name == "run"]
    assert len(runs[0]["steps"]) == 1000
    assert all(len(later["steps"]) <= 1 for later in runs[1:])  # the last: the run's status alone
    assert sum(len(later["steps"]) for later in runs[1:]) == 1000
    assert seen[-1][0] == "end"

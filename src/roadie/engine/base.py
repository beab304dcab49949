"""What every part of an engine shares: its options, its state, and how it tells an
observer (a progress display, the web's live updates) what happened."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from roadie.clock import Clock
from roadie.definitions import FrozenDefinition
from roadie.engine.cleanup import Cleanup
from roadie.log import get_logger
from roadie.registry import Registry
from roadie.states import StepStatus
from roadie.store import Outcome, Store

log = get_logger(__name__)

Observer = Callable[[str, dict[str, Any]], None]


@dataclass
class EngineOptions:
    concurrency: int = 32
    # Steps claimed beyond `concurrency` while dispatches are still out, held ready: a slot
    # an answer frees is filled at once, while the answer is recorded and more are claimed.
    # None: half of `concurrency` (at least one); 0: none (a freed slot waits for a record
    # and a claim).
    claim_ahead: int | None = None
    claim_ttl: float = 60.0  # a worker that stops heartbeating loses its claims after this
    poll_interval: float = 1.0
    seed: int | None = None
    cleanups: int = 4  # automatic cleanups a worker runs at once, beside its drain
    # A cleanup with more than this many rows to revert for one module waits for a person
    # to confirm it (`roadie cleanup RUN --confirm`); None: no cap. Per module: `cleanup_caps`.
    cleanup_cap: int | None = None
    cleanup_caps: dict[str, int] = field(default_factory=dict)
    # Seconds between a worker's orphan sweeps (what modules hold tagged for runs that
    # ended, and no ledger row names); None or 0: only `roadie sweep` sweeps.
    sweep_interval: float | None = 600.0
    # Seconds between a worker's looks at what running runs' borrows show, putting back a
    # borrow the world forgot (a server restarted) and telling what it lost; a module that
    # announces itself again is looked at by the next tick. None or 0: never.
    keep_interval: float | None = 30.0
    # Seconds the drain waits before recording answers again after the database failed
    # to take them, times the failures in a row. A pause on the loop, not the engine's
    # clock: a fake clock moved only between ticks would never end it. The simulation sets
    # 0: a pause on the loop ends when it will, and a replay must not depend on it.
    record_pause: float = 0.05
    # Render a new run's templates in a thread, so the loop (a web server's, a worker's)
    # goes on meanwhile. The simulation turns it off: it must see every moment a task
    # yields, and a thread ends when it will.
    render_in_thread: bool = True


class EngineState:
    """The attributes `Engine.__init__` sets, declared once for the parts built on them."""

    store: Store
    registry: Registry
    clock: Clock
    worker_id: str
    incarnation: str
    options: EngineOptions
    random: random.Random
    cleanup: Cleanup
    observer: Observer
    _stopping: asyncio.Event
    _definitions: dict[int, FrozenDefinition]
    _inflight_ids: dict[int, str]
    _claim_expiry: dict[str, datetime]
    _lost: set[int]
    _heart: asyncio.Task[None] | None

    def _tell(self, kind: str, data: dict[str, Any]) -> None:
        try:
            self.observer(kind, data)
        except Exception:  # an observer (a progress display) must never break the engine
            log.exception("observer failed")

    def _tell_outcome(self, o: Outcome) -> None:
        status = {StepStatus.READY: "retry"}.get(o.status, o.status.value)
        self._tell(
            "step",
            {
                "run_id": o.step.run_id,
                "step": o.step.name,
                "phase": o.step.phase,
                "status": status,
                "error": o.error,
                "rejections": o.rejections,
                "recorded": o.recorded,
            },
        )


def earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)

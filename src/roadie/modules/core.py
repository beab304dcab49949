"""Core's own module: `core.lease` (borrow a world setting), `core.wait`, `core.log`.

`core.lease` is carried out by the engine itself (`borrows=True`): reserving the
lease's row before the world is written is the ledger's job, not a module's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from roadie.durations import Duration
from roadie.log import get_logger
from roadie.registry.module import Call, Module
from roadie.states import Reversible

module = Module("core", "Roadie's own actions")
log = get_logger("roadie.event")


class LeaseParams(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    lease: str = Field(description="the lease to borrow, e.g. sandbox.weather")
    target: str | None = Field(None, description="for a targeted lease, what it applies to")
    value: Any = Field(description="the value to set while the lease is held")
    for_: Duration | None = Field(None, alias="for", description="give it back after this long")
    priority: int | None = Field(
        None,
        ge=-1_000_000,
        le=1_000_000,
        description="for a lease that stacks: this layer's place (the highest is shown; ties go to the later borrow)",
    )


class WaitParams(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    for_: Duration = Field(alias="for")


class LogParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str
    level: str = Field("info", pattern="^(debug|info|warning|error)$")


@module.action("lease", reversible=Reversible.OVERRIDE, params=LeaseParams, borrows=True)
async def lease(call: Call[LeaseParams]) -> None:
    """Borrow a world setting until cleanup (or `for`) gives it back."""
    raise RuntimeError("core.lease is carried out by the engine")  # pragma: no cover


@module.action("wait", reversible=Reversible.NONE, params=WaitParams)
async def wait(call: Call[WaitParams]) -> None:
    """Hold the phase for a while."""
    await call.clock.sleep(call.params.for_)


@module.action("log", reversible=Reversible.NONE, params=LogParams)
async def log_message(call: Call[LogParams]) -> None:
    """Write a line to Roadie's log."""
    getattr(log, call.params.level)(call.params.message, run_id=call.run_id, step_id=call.step_id)

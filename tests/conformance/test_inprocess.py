"""The in-process checks (`roadie conformance --module`): the sandbox world, run in
Roadie's own process, passes them all, fences included; a module that ignores its calls'
fences fails the `fences` check, and is still cleaned up after."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from roadie.conformance import Outcome, Report
from roadie.conformance.inprocess import check_module
from roadie.modules import sandbox
from roadie.modules.sandbox import SandboxWorld
from roadie.registry import Answer, Call, InspectCall, Inspected, Module, Registry, RevertCall
from roadie.states import Reversible


def run(module: Module, home: Path, **kw: Any) -> tuple[Report, Any]:
    async def go() -> tuple[Report, Any]:
        registry = Registry()
        registry.register(module, {"db": "world.db"}, base_dir=str(home))
        try:
            report = await check_module(registry, module.name, **kw)
            state = registry.state(module.name)
            return report, state.fences() if isinstance(state, SandboxWorld) else None
        finally:
            await registry.close()

    return asyncio.run(go())


def test_the_sandbox_in_process_passes_every_check_fences_included(tmp_path: Path) -> None:
    report, fences = run(sandbox.module, tmp_path, targets={"weather": "britain"})
    outcomes = {r.rule: (r.outcome, r.detail) for r in report.results}
    assert report.ok, outcomes
    assert outcomes["fences"][0] is Outcome.PASS, outcomes
    assert "refused (Superseded)" in outcomes["fences"][1]
    assert outcomes["lease sandbox.weather"][0] is Outcome.PASS
    # Lease writes went under fence 0: the live targets carry no mark of the kit's.
    assert {kind for kind, _ in fences} == {"key"}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "thing"


def careless() -> Module:
    """A ledger module that keeps its key ledger but reads no fence."""
    module = Module("careless", "acts for whoever calls")
    made: dict[str, list[str]] = {}

    @module.action("make", reversible=Reversible.LEDGER, params=Params)
    def make(call: Call[Params]) -> Answer:
        refs = made.setdefault(call.idempotency_key, [f"{call.idempotency_key}-0"])
        return Answer(resources=[{"kind": "thing", "ref": ref} for ref in refs])

    @make.revert
    def unmake(call: RevertCall) -> None:
        made.pop(call.idempotency_key, None)

    @module.inspect
    def inspect(call: InspectCall) -> list[Inspected]:
        mine = made.get(call.idempotency_key, [])
        return [Inspected(r.kind, r.ref, exists=r.ref in mine, ours=r.ref in mine) for r in call.resources]

    return module


def test_a_module_that_ignores_fences_fails_the_fences_check(tmp_path: Path) -> None:
    report, _ = run(careless(), tmp_path)
    outcomes = {r.rule: (r.outcome, r.detail) for r in report.results}
    assert outcomes["action careless.make"][0] is Outcome.PASS, outcomes
    outcome, detail = outcomes["fences"]
    assert outcome is Outcome.FAIL
    assert "was not refused" in detail
    assert not report.ok

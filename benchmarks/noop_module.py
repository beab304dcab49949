"""A module that does nothing, for measuring the engine and its database alone.

Loaded by the worker processes of `benchmarks/workers.py` through `roadie.toml`
(`[modules.noop] import = "noop_module:module"`, with this folder on `PYTHONPATH`).
"""

from __future__ import annotations

from typing import Any

from roadie.registry import Call, Module, RevertCall
from roadie.registry.module import NoParams
from roadie.states import Reversible

module = Module("noop", "does nothing, at once")


@module.action("none", reversible=Reversible.NONE, params=NoParams)
def none(call: Call[NoParams]) -> None:
    return None


@module.action("ledger", reversible=Reversible.LEDGER, params=NoParams)
def ledger(call: Call[NoParams]) -> list[dict[str, Any]]:
    return [{"kind": "thing", "ref": call.idempotency_key}]


@ledger.revert
def unledger(call: RevertCall) -> None:
    return None

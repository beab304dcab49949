"""The run engine: materialise, drain, the ledger's write half, cleanup, leases."""

from roadie.engine.cleanup import Cleanup, CleanupReport, PlannedCall
from roadie.engine.engine import Engine, EngineOptions

__all__ = ["Cleanup", "CleanupReport", "Engine", "EngineOptions", "PlannedCall"]

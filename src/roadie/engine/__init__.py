"""The run engine: materialise, drain, the ledger's write half, cleanup, leases."""

from roadie.engine.base import EngineOptions
from roadie.engine.cleanup import Cleanup, CleanupReport, PlannedCall
from roadie.engine.engine import Engine, settled

__all__ = ["Cleanup", "CleanupReport", "Engine", "EngineOptions", "PlannedCall", "settled"]

"""Storage: the schema, its migrations, and every query the engine makes."""

from roadie.store.records import CleanupClaim, NewRun, mint_token
from roadie.store.store import Claimed, NewResource, NewStep, Outcome, PhaseCounts, RunMove, Store

__all__ = [
    "Claimed",
    "CleanupClaim",
    "NewResource",
    "NewRun",
    "NewStep",
    "Outcome",
    "PhaseCounts",
    "RunMove",
    "Store",
    "mint_token",
]

"""Storage: the schema, its migrations, and every query the engine makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roadie.lazy import lazy_names

if TYPE_CHECKING:
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

# Imported when first used, not with the package: `Store` is every query module of the
# store, and a command that reads one concern (`roadie run list` reads the runs) imports
# `roadie.store.runs` or `roadie.store.dialects` alone, which imports this package first.
_LAZY = {
    **dict.fromkeys(("CleanupClaim", "NewRun", "mint_token"), "roadie.store.records"),
    **dict.fromkeys(
        ("Claimed", "NewResource", "NewStep", "Outcome", "PhaseCounts", "RunMove", "Store"), "roadie.store.store"
    ),
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

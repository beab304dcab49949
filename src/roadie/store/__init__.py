"""Storage: the schema, its migrations, and every query the engine makes."""

from roadie.store.store import Claimed, NewResource, NewStep, Outcome, PhaseCounts, RunMove, Store

__all__ = ["Claimed", "NewResource", "NewStep", "Outcome", "PhaseCounts", "RunMove", "Store"]

"""Modules, their actions and leases, and the registry that finds them."""

from roadie.registry.fences import FenceMarks
from roadie.registry.module import (
    Action,
    Answer,
    Call,
    InspectCall,
    Inspected,
    Lease,
    LeaseCall,
    Module,
    ModuleConfig,
    NoParams,
    Resource,
    RevertCall,
    RevertFailure,
    Tagged,
    TaggedCall,
    TaggedPage,
)
from roadie.registry.registry import Registry, build_registry

__all__ = [
    "Action",
    "Answer",
    "Call",
    "FenceMarks",
    "InspectCall",
    "Inspected",
    "Lease",
    "LeaseCall",
    "Module",
    "ModuleConfig",
    "NoParams",
    "Registry",
    "Resource",
    "RevertCall",
    "RevertFailure",
    "Tagged",
    "TaggedCall",
    "TaggedPage",
    "build_registry",
]

"""Modules, their actions and leases, and the registry that finds them."""

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
)
from roadie.registry.registry import Registry, build_registry

__all__ = [
    "Action",
    "Answer",
    "Call",
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
    "build_registry",
]

"""Every SQL statement of the system, one named method each, verb first.

The engine talks to the database only through `Store`, which is the connector (one
database, its transactions and write points) with the queries of each concern on top,
one module each. Methods that change state run in one transaction each; the ones the
drain calls take whole batches, so a worker pays one commit for many steps.
"""

from __future__ import annotations

from roadie.store.audit import AuditQueries
from roadie.store.auth import AuthQueries
from roadie.store.cleanups import CleanupQueries
from roadie.store.connector import Connector, WritePoint
from roadie.store.drain import DrainQueries
from roadie.store.events import EventQueries
from roadie.store.fences import FenceQueries
from roadie.store.keep import KeepQueries
from roadie.store.leases import LeaseQueries
from roadie.store.ledger import LedgerQueries
from roadie.store.notify import NotifyQueries
from roadie.store.records import Claimed, NewResource, NewStep, Outcome, PhaseCounts, RunMove
from roadie.store.runs import RunQueries
from roadie.store.schedules import ScheduleQueries
from roadie.store.stacks import StackQueries
from roadie.store.steps import StepQueries
from roadie.store.workers import WorkerQueries

__all__ = ["Claimed", "NewResource", "NewStep", "Outcome", "PhaseCounts", "RunMove", "Store", "WritePoint"]


class Store(
    EventQueries,
    RunQueries,
    ScheduleQueries,
    DrainQueries,
    StepQueries,
    LedgerQueries,
    LeaseQueries,
    StackQueries,
    CleanupQueries,
    WorkerQueries,
    AuditQueries,
    AuthQueries,
    NotifyQueries,
    FenceQueries,
    KeepQueries,
    Connector,
):
    """The whole store: open it with `await Store.open(url)`."""

"""A run keeps its setup (DESIGN §12; issue 37, item 4).

A game server that restarts mid-event comes back with its settings as its configuration
has them, and without what the event made. The module's key ledger survives, so the run
goes on without doing anything twice; without this, nothing would notice that the world
no longer shows what the run borrowed.

Every `keep_interval` seconds, and whenever a pulling module announces itself again (a
process started), a worker reads what each running run's borrows show:

- the borrowed value: nothing to do;
- the value saved before the borrow (what a restarted server shows): the borrow is put
  back, under a claim and a fence of its own, and staff are told;
- anything else: a person set it since; it is left alone and told, once.

Some seconds after an announce (`LOST_GRACE`: a restarted server loads its world a block
at a time, and what it saved is not back at once), what running runs made through that
module is inspected too, and what the world lost with its restart is told (it cannot be put back: the steps that made it
are done, and doing them again is what the key ledger exists to prevent).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from roadie.clock import Clock
from roadie.engine.leases import lease_call
from roadie.errors import RoadieError, StoreError
from roadie.log import get_logger
from roadie.registry import InspectCall, Registry, Resource
from roadie.registry.module import maybe_await
from roadie.store import Store, mint_token
from roadie.store.keep import Borrow

log = get_logger(__name__)

ANNOUNCE_LOOK = 3.0  # seconds between a worker's asks whether a module announced itself again
LOST_GRACE = 20.0  # seconds after an announce before what the module's world lost is looked for


@dataclass
class KeepReport:
    checked: int = 0
    reapplied: int = 0
    left_alone: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)


class Keeper:
    """One worker's keeping of running runs' setups."""

    def __init__(self, store: Store, registry: Registry, clock: Clock, *, claim_ttl: float, incarnation: str) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.claim_ttl = claim_ttl
        self.incarnation = incarnation
        self.seen_until: datetime | None = None  # announces up to here were looked at
        self.restarted: dict[str, datetime] = {}  # module -> when to look for what its world lost

    async def keep(self) -> KeepReport:
        """Look once: the borrows of every running run, and, for each module that announced
        itself since the last look, what running runs made through it."""
        report = KeepReport()
        now = self.clock.now()
        since, self.seen_until = self.seen_until, now
        if since is not None:
            for module, at in (await self.store.announced_since(since)).items():
                self.restarted[module] = at + timedelta(seconds=LOST_GRACE)
        for borrow in await self.store.borrows_in_force():
            await self._keep_borrow(borrow, report)
        for module in sorted(m for m, due in self.restarted.items() if due <= now):
            del self.restarted[module]
            await self._tell_lost(module, report)
        return report

    def next_due(self) -> datetime | None:
        """When a restarted module's world is next to be looked at for what it lost."""
        return min(self.restarted.values(), default=None)

    async def _keep_borrow(self, borrow: Borrow, report: KeepReport) -> None:
        row = borrow.row
        found = self.registry.lease_for_ref(row.ref)
        if found is None:
            return  # its module is not loaded here: a worker that has it keeps it
        lease, target = found
        token = mint_token(self.incarnation)
        fence = await self.store.claim_borrow_in_force(row.id, token, self.clock.now(), self.claim_ttl)
        if fence is None:
            return  # being borrowed again, restored, or looked at by another worker
        saved = row.payload["saved"]
        left_alone = None
        try:
            # A key of its own per look: a module's key ledger answers a key it applied
            # before with its stored answer, and would write nothing.
            call = lease_call(
                self.registry,
                lease,
                target,
                self.clock,
                key=f"keep-{row.run_id}-{row.id}-{fence}",
                run_id=row.run_id,
                fence=fence,
            )
            async with self.clock.timeout(self.claim_ttl / 3):
                shown = await maybe_await(lease.read_fn(call))
                report.checked += 1
                if shown == borrow.wanted:
                    return
                if shown == saved:
                    assert lease.write_fn is not None
                    await maybe_await(lease.write_fn(call, borrow.wanted))
                    report.reapplied += 1
                    log.warning("borrow put back", run_id=row.run_id, ref=row.ref, value=borrow.wanted)
                    await self.store.tell_world(
                        row.run_id,
                        "reapplied",
                        {"ref": row.ref, "value": borrow.wanted, "found": shown},
                        self.clock.now(),
                    )
                elif not (isinstance(row.payload, dict) and row.payload.get("left_alone", _NONE) == shown):
                    report.left_alone += 1
                    left_alone = (shown,)
                    log.warning("borrowed value changed since: left alone", run_id=row.run_id, ref=row.ref, shown=shown)
                    await self.store.tell_world(
                        row.run_id,
                        "left_alone",
                        {"ref": row.ref, "value": borrow.wanted, "found": shown},
                        self.clock.now(),
                    )
        except StoreError:
            raise
        except Exception as exc:  # one setting that cannot be read holds up no other
            message = exc.message if isinstance(exc, RoadieError) else f"{type(exc).__name__}: {exc}"
            report.errors.append(f"{row.ref}: {message}")
            log.warning("keeping a borrow failed", run_id=row.run_id, ref=row.ref, error=message)
        finally:
            await self.store.release_borrow(row.id, token, self.clock.now(), left_alone=left_alone)

    async def _tell_lost(self, module_name: str, report: KeepReport) -> None:
        """Inspect what running runs made through a module that restarted, and tell what is
        gone, per step: it cannot be put back."""
        try:
            module = self.registry.module(module_name)
        except RoadieError:
            return
        if module.inspect_fn is None:
            return
        rows = await self.store.things_in_force(module_name)
        by_step: dict[int, list[Any]] = defaultdict(list)
        for row in rows:
            if row.step_id is not None:
                by_step[row.step_id].append(row)
        for step in await self.store.steps_by_ids(sorted(by_step)):
            group = by_step[step.id]
            call = InspectCall(
                step.run_id,
                step.idempotency_key,
                [Resource(r.kind, r.ref, r.payload, r.member_key) for r in group],
                self.registry.state(module_name),
                self.clock,
                action=step.action.split(".", 1)[-1],
            )
            try:
                async with self.clock.timeout(self.claim_ttl / 3):
                    answer = list(await maybe_await(module.inspect_fn(call)))
            except Exception as exc:
                message = exc.message if isinstance(exc, RoadieError) else f"{type(exc).__name__}: {exc}"
                report.errors.append(f"{step.name}: inspect failed: {message}")
                continue
            gone = [r for r, seen in zip(group, answer, strict=False) if not getattr(seen, "exists", True)]
            if not gone:
                continue
            report.lost += len(gone)
            kinds: dict[str, int] = defaultdict(int)
            for r in gone:
                kinds[r.kind] += 1
            log.warning("the world lost what a step made", run_id=step.run_id, step=step.name, lost=dict(kinds))
            await self.store.tell_world(
                step.run_id,
                "lost",
                {"step": step.name, "module": module_name, "lost": dict(kinds), "refs": [r.ref for r in gone][:20]},
                self.clock.now(),
            )


_NONE = object()

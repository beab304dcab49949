"""The orphan sweep: what the world holds tagged with a Roadie key that no ledger row
names, and whose run has ended, is taken down.

Cleanup reverts what the ledger names. Some of what a run leaves behind it never names: a
creature an event boss summoned, one a respawn timer brought back after cleanup, what a
step made in a module without a key ledger whose answer never arrived. A module that can
list what it holds tagged (`tagged`) lets the sweep find them: an object whose key is a
step of a run that has ended, and which no live ledger row holds, is reverted through the
step's own action under that key, so the module's tag check still guards it (an id the
world has given to something else is never removed).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from roadie.clock import Clock
from roadie.engine.verify import LISTED
from roadie.errors import RoadieError, UnknownAction
from roadie.log import get_logger
from roadie.registry import Registry, Resource, RevertCall, Tagged, TaggedCall, TaggedPage
from roadie.registry.module import Module, maybe_await
from roadie.states import RunStatus
from roadie.store import Store

log = get_logger(__name__)
PAGE = 500  # tagged objects asked for at a time


@dataclass
class SweepReport:
    """What one module's sweep found and did. Counts are of tagged objects."""

    module: str
    plan: bool
    listed: int = 0  # tagged objects the module listed
    unknown: int = 0  # tagged with a key that names no step of ours
    in_flight: int = 0  # of a run still going on: its own to clean up
    in_ledger: int = 0  # a live ledger row holds it: cleanup will take it down
    orphans: int = 0  # of an ended run, named by no live row
    reverted: int = 0
    failed: int = 0
    found: list[dict[str, Any]] = field(default_factory=list)  # the first LISTED orphans
    errors: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sweeper:
    def __init__(self, store: Store, registry: Registry, clock: Clock, *, call_timeout: float = 60.0) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.call_timeout = call_timeout

    def listing(self) -> list[Module]:
        """The modules that can list what they hold tagged."""
        return [m for m in self.registry.modules if m.tagged_fn is not None]

    async def sweep(self, *, plan: bool = False, actor: str = "system", only: str | None = None) -> list[SweepReport]:
        """Sweep every module that answers `tagged` (or the one named `only`); with `plan`,
        find the orphans and revert nothing. Each module's sweep is audited."""
        reports = []
        for module in self.listing():
            if only is not None and module.name != only:
                continue
            report = await self._sweep_module(module, plan)
            if not plan and (report.orphans or report.failed):
                summary = {k: v for k, v in report.as_dict().items() if k not in ("module", "plan", "errors")}
                await self.store.write_audit(self.clock.now(), actor, "sweep", f"module:{module.name}", summary)
            if report.orphans:
                log.info("orphans swept", module=module.name, orphans=report.orphans, reverted=report.reverted)
            reports.append(report)
        if only is not None and not reports:
            raise RoadieError(f"module {only!r} is not loaded, or cannot list what it holds tagged")
        return reports

    async def _sweep_module(self, module: Module, plan: bool) -> SweepReport:
        report = SweepReport(module=module.name, plan=plan)
        assert module.tagged_fn is not None
        after: str | None = None
        state = self.registry.state(module.name)
        while True:
            try:
                async with self.clock.timeout(self.call_timeout):
                    answer = await maybe_await(module.tagged_fn(TaggedCall(after, PAGE, state, self.clock)))
            except Exception as exc:
                message = exc.message if isinstance(exc, RoadieError) else f"{type(exc).__name__}: {exc}"
                report.errors.append({"error": f"tagged failed: {message}"})
                return report
            page = answer if isinstance(answer, TaggedPage) else TaggedPage(list(answer or []))
            await self._judge(module, page.objects, report, plan)
            if page.next is None or not page.objects:
                return report
            after = page.next

    async def _judge(self, module: Module, objects: list[Tagged], report: SweepReport, plan: bool) -> None:
        report.listed += len(objects)
        by_key: dict[str, list[Tagged]] = defaultdict(list)
        for obj in objects:
            by_key[obj.key].append(obj)
        steps = {
            step.idempotency_key: (step, status) for step, status, _ in await self.store.steps_by_keys(list(by_key))
        }
        held = await self.store.live_targets([(module.name, o.kind, o.ref) for o in objects])
        for key, group in by_key.items():
            if key not in steps:
                report.unknown += len(group)
                continue
            step, run_status = steps[key]
            if not RunStatus(run_status).terminal:
                report.in_flight += len(group)
                continue
            orphans = [o for o in group if (module.name, o.kind, o.ref) not in held]
            report.in_ledger += len(group) - len(orphans)
            if not orphans:
                continue
            report.orphans += len(orphans)
            for o in orphans:
                if len(report.found) < LISTED:
                    report.found.append({"run": step.run_id, "step": step.name, "kind": o.kind, "ref": o.ref})
            if not plan:
                await self._revert(module, step.run_id, step.action, key, orphans, report)

    async def _revert(
        self, module: Module, run_id: int, action_id: str, key: str, orphans: list[Tagged], report: SweepReport
    ) -> None:
        try:
            action = self.registry.action(action_id)
            if action.module is not module or action.revert_fn is None:
                raise RoadieError(f"{action_id} is not {module.name}'s to revert")
            call = RevertCall(
                run_id=run_id,
                idempotency_key=key,
                resources=[Resource(o.kind, o.ref, o.payload) for o in orphans],
                state=self.registry.state(module.name),
                clock=self.clock,
                fence=await self.store.new_fence(),
            )
            async with self.clock.timeout(self.call_timeout):
                failures = list(await maybe_await(action.revert_fn(call)) or [])
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                message = f"no answer within {self.call_timeout:g}s"
            elif isinstance(exc, (RoadieError, UnknownAction)):
                message = exc.message
            else:
                message = f"{type(exc).__name__}: {exc}"
            report.failed += len(orphans)
            report.errors.append({"key": key, "error": message})
            return
        report.failed += len(failures)
        report.reverted += len(orphans) - len(failures)
        report.errors.extend({"key": key, "error": f"{f.kind} {f.ref}: {f.message}"} for f in failures)

"""Proof of undo (DESIGN §12): after a cleanup has reverted what it could, the world is
read back. Each reverted resource is inspected by its module (does it exist, and does it
still carry its step's tag?), and each restored lease is read (does the world show the
saved value again?). What came back is made live again in the ledger, under the cleanup's
claim, for the cleanup to revert again; the findings make the run's verdict.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from roadie.clock import Clock
from roadie.engine.leases import lease_call, stack_ref
from roadie.errors import RoadieError, UnknownAction
from roadie.log import get_logger
from roadie.registry import InspectCall, Inspected, Registry, Resource
from roadie.registry.module import maybe_await
from roadie.states import LAYER_KIND, LEASE_KINDS, STEP_KIND, Verdict
from roadie.store import CleanupClaim, Store
from roadie.store.rows import ResourceRow, StepRow

log = get_logger(__name__)
PAGE_ROWS = 1000  # reverted rows read back at a time
LISTED = 50  # findings named one by one in a verdict; beyond that they are counted
LATE_AFTER = 5.0  # seconds past its moment after which a teardown is reported late


@dataclass
class Verification:
    """What reading the world back found. Counts are of ledger rows."""

    inspected: int = 0  # rows a module inspected or core read back
    gone: int = 0  # gone from the world, or the saved value shown again
    came_back: int = 0  # reverted by an earlier round, there again: reopened, reverted again
    still_there: int = 0  # reverted by this round, yet still there: reopened, reverted again
    not_inspected: int = 0  # the inspect or the read failed, or nothing could make it
    unverifiable: int = 0  # the module answers no inspect, or the row was reverted by key
    foreign: int = 0  # the id now names another's object, or another run holds the target
    changed: int = 0  # a restored setting someone has set to another value since: left alone
    modules_without_inspect: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # the first LISTED, by name
    late: list[dict[str, Any]] = field(default_factory=list)  # leases given back long after their `until`

    @property
    def verdict(self) -> Verdict:
        if self.came_back or self.still_there or self.not_inspected:
            return Verdict.PARTIALLY_ROLLED_BACK
        if self.unverifiable or self.changed:
            # A setting changed by hand since is not the run's to take back, and not the
            # value from before the run either: the world is not proved what it was.
            return Verdict.UNVERIFIED
        return Verdict.VERIFIED_CLEAN

    def note(self, finding: str, row: ResourceRow, step: StepRow | None, detail: str | None = None) -> None:
        if len(self.findings) < LISTED:
            entry = {"finding": finding, "resource": row.id, "step": step.name if step else None}
            entry.update(kind=row.kind, ref=stack_ref(row))  # a layer: the lease it is a layer of
            if detail:
                entry["detail"] = detail
            self.findings.append(entry)

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "inspected": self.inspected,
            "gone": self.gone,
            "came_back": self.came_back,
            "still_there": self.still_there,
            "not_inspected": self.not_inspected,
            "unverifiable": self.unverifiable,
            "foreign": self.foreign,
            "changed": self.changed,
            "modules_without_inspect": self.modules_without_inspect,
            "findings": self.findings,
        }


def late(what: str, due: datetime, done: datetime) -> dict[str, Any]:
    """A teardown that came long after its moment (no worker was alive then), as a report says it."""
    return {"what": what, "due": due.isoformat(), "done": done.isoformat(), "late_s": (done - due).total_seconds()}


def _inspected(answer: Any) -> tuple[bool, bool]:
    if isinstance(answer, Inspected):
        return answer.exists, answer.ours and answer.exists
    if isinstance(answer, dict) and isinstance(answer.get("exists"), bool):
        return answer["exists"], bool(answer.get("ours", False)) and answer["exists"]
    raise RoadieError(f"not an inspect answer: {answer!r:.80}")


def _message(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    return exc.message if isinstance(exc, RoadieError) else f"{type(exc).__name__}: {exc}"


class Verifier:
    """One cleanup's reading back of the world, under that cleanup's claim.

    `call_timeout` bounds each call to a module, and `keep_claim` is awaited between
    pages and calls so that the claim is pushed on before it runs out."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Clock,
        claim: CleanupClaim,
        *,
        call_timeout: float,
        keep_claim: Callable[[], Awaitable[None]],
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.claim = claim
        self.call_timeout = call_timeout
        self.keep_claim = keep_claim

    async def run(self, member_key: str | None, this_round: set[int]) -> tuple[Verification, list[int]]:
        """Read back every row of the run (or of one member) that is reverted; answer what
        was found and the ids made live again. A row in `this_round` was reverted by this
        round: found there, it is *still there*, not *back*."""
        found = Verification()
        reopened: list[int] = []
        after = 0
        while True:
            rows = await self.store.reverted_rows(
                self.claim.run_id, after=after, limit=PAGE_ROWS, member_key=member_key
            )
            if not rows:
                break
            after = rows[-1].id
            by_step: dict[int | None, list[ResourceRow]] = defaultdict(list)
            for row in rows:
                by_step[row.step_id].append(row)
            steps = {s.id: s for s in await self.store.steps_by_ids([i for i in by_step if i is not None])}
            back: list[ResourceRow] = []
            for step_id, group in by_step.items():
                step = steps.get(step_id) if step_id is not None else None
                back.extend(await self._step(step, group, found))
                await self.keep_claim()
            if back:
                reopened.extend(await self._reopen(back, steps, this_round, found))
        log.info("cleanup verified", run_id=self.claim.run_id, verdict=found.verdict.value, reopened=len(reopened))
        return found, reopened

    async def _step(self, step: StepRow | None, rows: list[ResourceRow], found: Verification) -> list[ResourceRow]:
        """Inspect one step's rows; answer those that are back in the world."""
        back: list[ResourceRow] = []
        resources = [r for r in rows if r.kind != STEP_KIND and r.kind not in LEASE_KINDS]
        for row in rows:
            if row.kind == STEP_KIND:
                # Its answer never arrived: the module reverted by key, and only it knows what
                # that key made, so there is nothing to name in an inspect.
                found.unverifiable += 1
                found.note("unverifiable", row, step, "reverted by key: its answer never arrived")
            elif row.kind in LEASE_KINDS:
                if row.until is not None and row.reverted_at is not None and len(found.late) < LISTED:
                    by = (row.reverted_at - row.until).total_seconds()
                    if by > LATE_AFTER:
                        found.late.append(late("lease " + stack_ref(row), row.until, row.reverted_at))
                if await self._lease_back(row, step, found):
                    back.append(row)
        if resources:
            back.extend(await self._resources_back(step, resources, found))
        return back

    async def _resources_back(
        self, step: StepRow | None, rows: list[ResourceRow], found: Verification
    ) -> list[ResourceRow]:
        try:
            if step is None:
                raise RoadieError("the rows name no step, so no module can inspect them")
            action = self.registry.action(step.action)
        except (RoadieError, UnknownAction) as exc:
            found.not_inspected += len(rows)
            for row in rows:
                found.note("not_inspected", row, step, exc.message)
            return []
        module = action.module
        if module.inspect_fn is None:
            found.unverifiable += len(rows)
            found.modules_without_inspect = sorted({*found.modules_without_inspect, module.name})
            return []
        call = InspectCall(
            self.claim.run_id,
            step.idempotency_key,
            [Resource(r.kind, r.ref, r.payload, r.member_key) for r in rows],
            self.registry.state(module.name),
            self.clock,
            action=action.name,
        )
        try:
            async with self.clock.timeout(self.call_timeout):
                answer = await maybe_await(module.inspect_fn(call))
            seen = [_inspected(a) for a in answer]
            if len(seen) != len(rows):
                raise RoadieError(f"{module.name} inspect answered {len(seen)} results for {len(rows)} resources")
        except Exception as exc:
            message = f"inspect failed: {_message(exc, self.call_timeout)}"
            found.not_inspected += len(rows)
            for row in rows:
                found.note("not_inspected", row, step, message)
            log.warning("inspect failed", run_id=self.claim.run_id, step=step.name, error=message)
            return []
        found.inspected += len(rows)
        back: list[ResourceRow] = []
        for row, (exists, ours) in zip(rows, seen, strict=True):
            if exists and ours:
                back.append(row)
            elif exists:
                found.foreign += 1  # the id was reused for something the run did not make
            else:
                found.gone += 1
        return back

    async def _lease_back(self, row: ResourceRow, step: StepRow | None, found: Verification) -> bool:
        """Read a restored setting: True when the world shows what the run wrote again.
        A popped layer should leave the world showing what its stack shows now."""
        layer = row.kind == LAYER_KIND
        if not (isinstance(row.payload, dict) and ("value" if layer else "saved") in row.payload):
            return False  # reserved, never written over: there was nothing to give back
        ref = stack_ref(row)
        expected = await self.store.stack_shows(ref) if layer else (row.payload["saved"],)
        if expected is None:
            return False
        found_lease = self.registry.lease_for_ref(ref)
        if found_lease is None:
            found.not_inspected += 1
            found.note("not_inspected", row, step, f"no module registers the lease {ref!r}")
            return False
        lease, target = found_lease
        call = lease_call(self.registry, lease, target, self.clock, key=None, run_id=row.run_id)
        try:
            async with self.clock.timeout(self.call_timeout):
                value = await maybe_await(lease.read_fn(call))
        except Exception as exc:
            message = f"read failed: {_message(exc, self.call_timeout)}"
            found.not_inspected += 1
            found.note("not_inspected", row, step, message)
            return False
        found.inspected += 1
        if value == expected[0]:
            found.gone += 1
            return False
        if value in ([row.payload["value"]] if layer else await self.store.values_written(row.run_id, row.ref)):
            return True
        # Neither what was saved nor what the run wrote: a person, or another run that has
        # borrowed it since, set it. Not the run's to take back.
        found.changed += 1
        found.note("changed", row, step, f"the world shows {value!r:.60}, set by someone else since")
        return False

    async def _reopen(
        self, back: list[ResourceRow], steps: dict[int, StepRow], this_round: set[int], found: Verification
    ) -> list[int]:
        why = "came back after cleanup"
        reopened = set(await self.store.reopen_resources(self.claim, [r.id for r in back], why, self.clock.now()))
        for row in back:
            step = steps.get(row.step_id) if row.step_id is not None else None
            if row.id not in reopened:
                found.foreign += 1  # another run holds its target now
                found.note("foreign", row, step, "another run holds its target now")
            elif row.id in this_round:
                found.still_there += 1
                found.note("still_there", row, step)
            else:
                found.came_back += 1
                found.note("came_back", row, step)
        return sorted(reopened)

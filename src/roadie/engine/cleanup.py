"""Cleanup, the read-and-undo half of the ledger (DESIGN §5).

Live rows are read newest first and grouped per step: one `revert` per step for its
module's rows, a key-only `revert` for a placeholder still pending, and core's own
restore for each borrowed value. Rows are read a page at a time along the index, and
what a page reverted is recorded in one transaction, so a run with a hundred thousand
resources is cleaned up in bounded memory and in time linear in its size.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from roadie.clock import Clock
from roadie.engine import leases
from roadie.engine.verify import LATE_AFTER, Verifier, late
from roadie.errors import ClaimLost, HandedBack, InvalidState, RoadieError, StoreError, UnknownAction
from roadie.log import get_logger
from roadie.registry import Registry, Resource, RevertCall, RevertFailure
from roadie.registry.module import maybe_await
from roadie.states import (
    LAYER_KIND,
    LEASE_KINDS,
    OVERRIDE_KIND,
    STEP_KIND,
    CleanupPolicy,
    CleanupStatus,
    ResourceState,
    RunStatus,
    Verdict,
    judge_cleanup,
)
from roadie.store import CleanupClaim, Store, mint_token
from roadie.store.records import LiveGroup
from roadie.store.rows import ResourceRow, RunRow, StepRow

log = get_logger(__name__)
PAGE_ROWS = 500  # live rows read at a time, with the older rows of the steps they start
REVERT_BATCH = 1000  # resources per revert call; a step with more is reverted in slices


@dataclass
class PlannedCall:
    """One call cleanup would make: a module's `revert` for a step, or core's restore of a lease."""

    kind: str  # "revert" | "revert-by-key" | "restore"
    step_id: int | None
    step: str
    action: str
    idempotency_key: str
    resources: list[dict[str, Any]]
    row_ids: list[int]


@dataclass
class PreviewGroup:
    """One module's resources of one kind that cleanup would take down."""

    module: str
    kind: str
    count: int
    newest: list[str]  # the newest few, in the world's words
    cap: int | None
    over_cap: bool  # the module's count (all its kinds) is over its cap: a person confirms


def describe(kind: str, ref: str, payload: Any) -> str:
    """A ledger row in the world's words, from what its module said of it: its `label` or
    `name` when it gave one, else what it is and where (`orc in britain`), else its kind."""
    if kind == OVERRIDE_KIND:
        saved = payload.get("saved") if isinstance(payload, dict) else None
        return f"{ref}, back to {saved!r}" if isinstance(payload, dict) and "saved" in payload else ref
    if kind == LAYER_KIND and isinstance(payload, dict):
        layer = f"{payload.get('lease')}: the layer of priority {payload.get('priority')}"
        return f"{layer} showing {payload['value']!r}" if "value" in payload else layer
    if kind == STEP_KIND:
        return "whatever its key made (its answer never arrived)"
    if isinstance(payload, dict):
        label = payload.get("label") or payload.get("name")
        if isinstance(label, str) and label:
            return f"{label} ({kind} {ref})"
        said = what_and_where(payload)
        if said:
            return f"{said} ({kind} {ref})"
    return f"{kind} {ref}"


def what_and_where(said: Mapping[str, Any]) -> str | None:
    """What a thing is and where (`orc in britain`), from the words modules use for them
    (`kind`, `type` or `species`; `region`, `zone`, `map` or `world`), or None when
    nothing says what it is. A resource's payload says it so, and so do the params of
    the step that makes one."""
    what = next((said[k] for k in ("kind", "type", "species") if isinstance(said.get(k), str)), None)
    where = next((said[k] for k in ("region", "zone", "map", "world") if isinstance(said.get(k), str)), None)
    return f"{what}{f' in {where}' if where else ''}" if what else None


@dataclass
class _Marks:
    """What a cleanup's calls did and the store has not been told yet, and when it last was."""

    written: datetime
    expires: datetime  # when the cleanup's claim runs out unless a write pushes it on
    reverted: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    this_round: set[int] = field(default_factory=set)  # every row this cleanup reverted
    held: set[int] = field(default_factory=set)  # lease rows another restorer held when this cleanup came
    left_alone: list[tuple[ResourceRow, StepRow | None, Any]] = field(default_factory=list)  # and what was shown


@dataclass
class CleanupReport:
    run_id: int
    status: str
    member_key: str | None = None
    calls: int = 0
    reverted: int = 0
    restored: int = 0
    failed: int = 0
    held: int = 0  # lease rows another restorer (the expiry sweeper) was giving back
    left_alone: int = 0  # borrowed values someone set to another value since: not written over
    verdict: str = ""  # a Verdict, once the world was read back
    verification: dict[str, Any] = field(default_factory=dict)  # Verification.as_dict()
    late: list[dict[str, Any]] = field(default_factory=list)  # the run's end, its cleanup, leases: how late
    over_cap: dict[str, Any] = field(default_factory=dict)  # by module: more to revert than its cap
    errors: list[dict[str, Any]] = field(default_factory=list)
    forgotten: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _late(run: RunRow, now: datetime) -> list[dict[str, Any]]:
    """How late the run's end and this cleanup came, when no worker was alive to do them on
    time: an end past its duration, or a cleanup long after the end (automatic ones)."""
    found: list[dict[str, Any]] = []
    ends, ended = run.ends_at, run.ended_at
    if ends is not None and ended is not None and (ended - ends).total_seconds() > LATE_AFTER:
        found.append(late("run end", ends, ended))
    automatic = run.cleanup_policy == CleanupPolicy.AUTO.value and run.cleanup_status == CleanupStatus.PENDING.value
    if automatic and run.ended_at is not None and (now - run.ended_at).total_seconds() > LATE_AFTER:
        found.append(late("cleanup", run.ended_at, now))
    return found


def _by_module(groups: list[LiveGroup]) -> dict[str, int]:
    """Live rows per module, all kinds together: what a module's cap is held against."""
    totals: dict[str, int] = defaultdict(int)
    for g in groups:
        totals[g.owner] += g.count
    return totals


class Cleanup:
    """One worker's cleanups. Each takes the run's cleanup claim under a token of its own
    (minted from `incarnation`), names it in every write, and stops at the first write the
    database refuses for a lost claim (`ClaimLost`). Every call to a module has a deadline
    (`call_timeout`, on the clock) well inside the claim's lifetime, so a module that never
    answers costs one failed call, not the cleanup."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Clock,
        worker: str,
        claim_ttl: float = 300.0,
        *,
        incarnation: str | None = None,
        call_timeout: float | None = None,
        cap: int | None = None,
        caps: dict[str, int] | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        # Whether the worker is stopping: a cleanup then starts no new call (`_keeper`).
        self.stopping = stopping or (lambda: False)
        self.registry = registry
        self.clock = clock
        self.worker = worker
        self.claim_ttl = claim_ttl
        self.incarnation = incarnation or secrets.token_hex(6)
        self.call_timeout = call_timeout if call_timeout is not None else claim_ttl / 3
        self.cap = cap  # rows one module may have reverted by one cleanup unconfirmed; None: any
        self.caps = dict(caps or {})  # the same, per module

    async def _pages(
        self, run_id: int, member_key: str | None
    ) -> AsyncIterator[tuple[dict[int, StepRow], list[tuple[int | None, list[ResourceRow]]]]]:
        """Yield (steps by id, [(step id, rows newest first)]) a page at a time, the steps
        in the order of their newest live row.

        A page is up to `PAGE_ROWS` live rows read newest first from where the last page
        ended, plus the older rows of each step it starts, so that a step's rows are
        reverted together; rows of a step an earlier page handed out are passed over. The
        run is read once along its index whatever its size, and memory is bounded by the
        page (and by the largest step).
        """
        before: int | None = None
        handed: set[int | None] = set()
        while True:
            page = await self.store.live_rows_page(run_id, member_key=member_key, before=before, limit=PAGE_ROWS)
            if not page:
                return
            before = page[-1].id
            by_step: dict[int | None, list[ResourceRow]] = {}
            for row in page:
                if row.step_id not in handed:
                    by_step.setdefault(row.step_id, []).append(row)
            if not by_step:
                continue
            older = await self.store.live_rows_of_steps(run_id, list(by_step), member_key=member_key, before=before)
            for row in older:
                by_step[row.step_id].append(row)
            handed.update(by_step)
            steps = {s.id: s for s in await self.store.steps_by_ids([i for i in by_step if i is not None])}
            yield steps, list(by_step.items())

    def _calls_for(self, step: StepRow | None, rows: list[ResourceRow]) -> list[PlannedCall]:
        name = step.name if step else "(unknown step)"
        action = step.action if step else "(unknown)"
        key = step.idempotency_key if step else ""
        calls: list[PlannedCall] = []
        ledgered = [r for r in rows if r.kind != STEP_KIND and r.kind not in LEASE_KINDS]
        for start in range(0, len(ledgered), REVERT_BATCH):
            part = ledgered[start : start + REVERT_BATCH]
            calls.append(
                PlannedCall(
                    "revert",
                    step.id if step else None,
                    name,
                    action,
                    key,
                    [{"kind": r.kind, "ref": r.ref, "payload": r.payload, "memberKey": r.member_key} for r in part],
                    [r.id for r in part],
                )
            )
        placeholders = [r for r in rows if r.kind == STEP_KIND]
        if placeholders:
            # The answer never arrived: only the module, by its key, knows what it made.
            calls.append(
                PlannedCall(
                    "revert-by-key",
                    step.id if step else None,
                    name,
                    action,
                    placeholders[0].ref,
                    [],
                    [r.id for r in placeholders],
                )
            )
        for r in rows:
            if r.kind in LEASE_KINDS:
                calls.append(
                    PlannedCall(
                        "restore",
                        step.id if step else None,
                        name,
                        "core.lease",
                        key,
                        [{"kind": r.kind, "ref": r.ref, "payload": r.payload}],
                        [r.id],
                    )
                )
        return calls

    async def plan(self, run_id: int, member_key: str | None = None) -> list[PlannedCall]:
        """What cleanup would call, in order, without calling anything."""
        await self.store.get_run(run_id)
        planned: list[PlannedCall] = []
        async for steps, groups in self._pages(run_id, member_key):
            for step_id, rows in groups:
                planned.extend(self._calls_for(steps.get(step_id) if step_id else None, rows))
        return planned

    async def preview(self, run_id: int, member_key: str | None = None, newest: int = 3) -> list[PreviewGroup]:
        """What cleanup would take down, by module and kind, in the world's words: how many,
        the newest few, and whether the module's cap would hold the cleanup for a person."""
        await self.store.get_run(run_id)
        groups = await self.store.live_summary(run_id, member_key=member_key, newest=newest)
        totals = _by_module(groups)
        return [
            PreviewGroup(
                module=g.owner,
                kind=g.kind,
                count=g.count,
                newest=[describe(r.kind, r.ref, r.payload) for r in g.newest],
                cap=self._cap(g.owner),
                over_cap=self._over(g.owner, totals[g.owner]),
            )
            for g in groups
        ]

    def _cap(self, module: str) -> int | None:
        return self.caps.get(module, self.cap)

    def _over(self, module: str, count: int) -> bool:
        cap = self._cap(module)
        return cap is not None and count > cap

    async def _over_caps(self, run_id: int, member_key: str | None) -> dict[str, Any]:
        totals = _by_module(await self.store.live_summary(run_id, member_key=member_key, newest=0))
        return {m: {"count": n, "cap": self._cap(m)} for m, n in sorted(totals.items()) if self._over(m, n)}

    async def run(
        self,
        run_id: int,
        *,
        actor: str = "system",
        member_key: str | None = None,
        again: bool = False,
        confirm: bool = False,
    ) -> CleanupReport:
        """Revert every live resource of a run (or of one member), newest first.

        A full cleanup needs the run to have ended: cancelling is how a run in flight is
        stopped, and its cleanup follows. `again` is a human's retry after `incomplete`.
        A module with more to revert than its cap holds the cleanup (`held`) until a
        person runs it with `confirm`, which is audited with the counts.
        """
        run = await self.store.get_run(run_id, definition=False)
        if member_key is None and not RunStatus(run.status).terminal:
            raise InvalidState(f"run {run_id} is {run.status}; cancel it first, or clean up one member with --member")
        claim = CleanupClaim(run_id, mint_token(self.incarnation), self.claim_ttl)
        claimed_at = self.clock.now()
        fence = await self.store.claim_cleanup(
            claim, self.worker, claimed_at, again=again, scoped=member_key is not None
        )
        if fence is None:
            raise InvalidState(f"run {run_id}'s cleanup is under way elsewhere, or not pending")
        claim = replace(claim, fence=fence)
        if self.clock.now() >= claimed_at + timedelta(seconds=self.claim_ttl):
            # The claim runs from when it was asked for: a database that took longer than
            # its lifetime to commit it handed over a claim anyone may take already, and
            # two cleanups would revert the same steps. It acts on nothing.
            raise ClaimLost(f"run {run_id}'s cleanup claim had run out by the time it was taken; nothing was done")
        await self.store.freshen_ledger_statistics(run_id)
        report = CleanupReport(run_id=run_id, status="", member_key=member_key, late=_late(run, self.clock.now()))
        over = await self._over_caps(run_id, member_key) if self.cap is not None or self.caps else {}
        if over and not confirm:
            report.over_cap = over
            status = await self.store.finish_cleanup(
                claim, report.as_dict(), actor, self.clock.now(), member_key=member_key, held=True
            )
            report.status = status.value
            log.warning("cleanup held for a person to confirm", run_id=run_id, over_cap=over)
            return report
        if over:
            report.over_cap = over
            await self.store.confirm_cleanup(claim, actor, over, self.clock.now())
        marks = _Marks(written=self.clock.now(), expires=claimed_at + timedelta(seconds=self.claim_ttl))
        await self._revert_live(claim, member_key, report, marks)
        # Proof of undo: the world is read back, and what came back is reverted again
        # (its proof is the next round's, which the verdict makes due).
        keep = self._keeper(claim, marks)
        verifier = Verifier(
            self.store, self.registry, self.clock, claim, call_timeout=self.call_timeout, keep_claim=keep
        )
        found, reopened = await verifier.run(member_key, marks.this_round)
        if reopened:
            await self._revert_live(claim, member_key, report, marks, only=set(reopened))
        named = {f["resource"] for f in found.findings if f["finding"] == "changed"}
        for row, step, shown in marks.left_alone:
            if row.id not in named:  # read back since as something else: still named
                found.note("changed", row, step, f"left alone: the world showed {shown!r:.60}, set by someone else")
        report.verdict = found.verdict.value
        report.verification = found.as_dict()
        report.late.extend(found.late)
        for entry in report.late:
            log.warning("teardown came late", run_id=run_id, what=entry["what"], late_s=entry["late_s"])
        report.forgotten = [
            {"resource": r.id, "kind": r.kind, "ref": r.ref, "why": r.error}
            for r in await self.store.list_resources(run_id, state=ResourceState.ABANDONED)
        ]
        # Judged by the database in the transaction that releases the claim, counting what
        # is still live there: a run of a hundred thousand rows is not read back whole.
        status = await self.store.finish_cleanup(
            claim,
            report.as_dict(),
            actor,
            self.clock.now(),
            member_key=member_key,
            rolled_back=found.verdict is Verdict.PARTIALLY_ROLLED_BACK,
            found_held=marks.held,
        )
        report.status = status.value
        report.verdict = judge_cleanup(found.verdict, status, report.left_alone).value  # as the store judged it
        report.verification["verdict"] = report.verdict
        log.info(
            "cleanup finished",
            run_id=run_id,
            status=report.status,
            verdict=report.verdict,
            reverted=report.reverted,
            restored=report.restored,
            failed=report.failed,
        )
        return report

    async def _revert_live(
        self,
        claim: CleanupClaim,
        member_key: str | None,
        report: CleanupReport,
        marks: _Marks,
        *,
        only: set[int] | None = None,
    ) -> None:
        """One pass over the live rows (or those of them in `only`), newest first, each
        page recorded as it ends."""
        keep = self._keeper(claim, marks)
        async for steps, groups in self._pages(claim.run_id, member_key):
            for step_id, all_rows in groups:
                rows = all_rows if only is None else [r for r in all_rows if r.id in only]
                if not rows:
                    continue
                step = steps.get(step_id) if step_id else None
                for call in self._calls_for(step, rows):
                    await keep()  # no call starts with less claim left than its deadline
                    await self._carry_out(claim, step, call, rows, report, marks)
            await self._record(claim, marks)

    def _keeper(self, claim: CleanupClaim, marks: _Marks) -> Callable[[], Awaitable[None]]:
        """What is awaited before each call: the claim is pushed on (with what `marks`
        holds) once a third of its lifetime has passed since the last write, or when less
        of it is left than a call's deadline (DESIGN §13: no call starts with less claim
        time left than it needs, so none can land after the claim has passed on).

        Once the worker is stopping, no call starts: what is done is recorded, and the
        claim given back (`HandedBack`) for another worker to carry on at once. Waiting
        for the rest would hold the stop up for a call's deadline per call when the
        module is down, and the claim for its lifetime after a SIGKILL ends the wait."""

        async def keep() -> None:
            if self.stopping():
                await self._record(claim, marks)
                await self.store.release_cleanup(claim)
                raise HandedBack(f"run {claim.run_id}'s cleanup was given back unfinished: this worker is stopping")
            now = self.clock.now()
            left = (marks.expires - now).total_seconds()
            if (now - marks.written).total_seconds() >= self.claim_ttl / 3 or left < self.call_timeout:
                await self._record(claim, marks)

        return keep

    async def _carry_out(
        self,
        claim: CleanupClaim,
        step: StepRow | None,
        call: PlannedCall,
        rows: list[ResourceRow],
        report: CleanupReport,
        marks: _Marks,
    ) -> None:
        """Make one planned call and note how it went in `marks`; a restore is recorded at
        once (with what was noted before it), since it frees a target another run may be
        waiting to borrow."""
        report.calls += 1
        now = self.clock.now
        run_id = claim.run_id
        try:
            if call.kind == "restore":
                fence = await self.store.claim_lease_row(claim, call.row_ids[0], now())
                if fence is None:
                    report.held += 1  # the expiry sweeper is giving it back, and marks it itself
                    marks.held.add(call.row_ids[0])
                    return
                marks.held.discard(call.row_ids[0])  # tried by this cleanup: its outcome is this one's
                row = next(r for r in rows if r.id == call.row_ids[0])
                async with self._deadline():
                    changed = await leases.restore(
                        self.store, self.registry, self.clock, row, self.call_timeout, fence=fence
                    )
                marks.reverted.extend(call.row_ids)
                await self._record(claim, marks)
                if changed is None:
                    report.restored += 1
                else:  # someone set it since: theirs now, and the verdict names it
                    report.left_alone += 1
                    marks.left_alone.append((row, step, changed.shown))
                return
            async with self._deadline():
                failures = await self._revert(claim, step, call)
        except (ClaimLost, StoreError):
            # The claim is gone, or the database is unwell (a commit lost with its
            # connection): neither is the world refusing, and the row keeps no error. The
            # cleanup stops and is due again once its claim is released or runs out.
            raise
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RoadieError) else exc.message
            if isinstance(exc, TimeoutError):
                message = f"no answer within {self.call_timeout:g}s"
            marks.failed.update({i: message for i in call.row_ids})
            report.failed += len(call.row_ids)
            report.errors.extend({"resource": i, "step": call.step, "error": message} for i in call.row_ids)
            log.warning("revert failed", run_id=run_id, step=call.step, error=message)
            return
        ids = set(call.row_ids)
        by_target = {(r.kind, r.ref): r.id for r in rows if r.id in ids}
        failed_ids = {by_target[(f.kind, f.ref)]: f.message for f in failures if (f.kind, f.ref) in by_target}
        marks.reverted.extend(i for i in call.row_ids if i not in failed_ids)
        marks.failed.update(failed_ids)
        report.reverted += len(call.row_ids) - len(failed_ids)
        report.failed += len(failed_ids)
        report.errors.extend({"resource": i, "step": call.step, "error": m} for i, m in failed_ids.items())

    async def _record(self, claim: CleanupClaim, marks: _Marks) -> None:
        """Write what `marks` holds in one transaction under the claim, which pushes the
        claim on (with nothing to write, the claim alone is pushed on)."""
        now = self.clock.now()
        if marks.reverted or marks.failed:
            await self.store.mark_reverted(claim, marks.reverted, now, failures=marks.failed)
            marks.this_round.update(marks.reverted)
        else:
            await self.store.extend_cleanup_claim(claim, now)
        marks.reverted, marks.failed, marks.written = [], {}, now
        marks.expires = now + timedelta(seconds=self.claim_ttl)
        if self.clock.now() >= marks.expires:
            # The write pushed on a claim that ran out while it committed: another may
            # hold the cleanup now, and nothing more is done under this one.
            raise ClaimLost(f"run {claim.run_id}'s cleanup claim ran out while it was pushed on")

    def _deadline(self) -> AbstractAsyncContextManager[object]:
        return self.clock.timeout(self.call_timeout)

    async def _revert(self, claim: CleanupClaim, step: StepRow | None, call: PlannedCall) -> list[RevertFailure]:
        if step is None:
            raise InvalidState("the row names no step, so no module can revert it; forget it")
        try:
            action = self.registry.action(step.action)
        except UnknownAction as exc:
            raise InvalidState(f"{exc.message}: its module is not loaded") from exc
        assert action.revert_fn is not None
        revert_call = RevertCall(
            run_id=claim.run_id,
            idempotency_key=step.idempotency_key,
            resources=[Resource(r["kind"], r["ref"], r["payload"], r["memberKey"]) for r in call.resources],
            state=self.registry.state(action.module.name),
            clock=self.clock,
            fence=claim.fence,
        )
        answer = await maybe_await(action.revert_fn(revert_call))
        if answer is None:
            return []
        if isinstance(answer, list) and all(isinstance(f, RevertFailure) for f in answer):
            return answer
        raise InvalidState(f"{action.id}'s revert answered something that is not a list of failures: {answer!r:.80}")

    async def forget(self, resource_id: int, *, actor: str, reason: str) -> ResourceRow:
        """An admin gives up on a resource that can never be reverted. Audited; kept as `abandoned`."""
        if not reason.strip():
            raise InvalidState("forgetting a resource needs a reason")
        return await self.store.abandon_resource(resource_id, actor, reason.strip(), self.clock.now())

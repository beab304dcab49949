"""Leases: borrowing a world setting, giving it back, and the expiry sweeper.

The order of a borrow is what makes it safe to crash anywhere: the lease's row is
reserved when its step is claimed (before anything), the value about to be overwritten
is saved into that row (before the write), and only then is the world written. A retry
finds the saved value and does not read again, because what it would read now is its
own borrowed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog

from roadie.clock import Clock
from roadie.errors import ClaimLost, PermanentError
from roadie.registry import LeaseCall, Registry
from roadie.registry.module import Lease, maybe_await
from roadie.states import StepStatus
from roadie.store import Outcome, Store, mint_token
from roadie.store.rows import ResourceRow, StepRow

log = structlog.get_logger(__name__)


def lease_ref(registry: Registry, params: dict[str, Any]) -> str:
    """The ledger ref of the target a `core.lease` step borrows: `lease` or `lease#target`."""
    lease = registry.lease(str(params["lease"]))
    target = params.get("target")
    if lease.targeted and target is None:
        raise PermanentError(f"lease {lease.id} is targeted: say which target")
    if not lease.targeted and target is not None:
        raise PermanentError(f"lease {lease.id} takes no target")
    return lease.ref(None if target is None else str(target))


def _resolve(registry: Registry, ref: str) -> tuple[Lease, str | None]:
    found = registry.lease_for_ref(ref)
    if found is None:
        raise PermanentError(f"no module registers the lease {ref!r}")
    return found


def lease_call(
    registry: Registry, lease: Lease, target: str | None, clock: Clock, *, key: str | None, run_id: int | None
) -> LeaseCall:
    return LeaseCall(
        lease=lease.id,
        target=target,
        state=registry.state(lease.module.name),
        clock=clock,
        idempotency_key=key,
        run_id=run_id,
    )


def restore_key(row: ResourceRow) -> str:
    """The idempotency key of giving a borrowed value back: one per ledger row, so a
    restore retried after a crash is the same restore."""
    return f"restore-{row.run_id}-{row.id}"


async def borrow(store: Store, registry: Registry, clock: Clock, step: StepRow, reserved_id: int) -> Outcome:
    """Carry out a `core.lease` step whose row `reserved_id` is already reserved."""
    assert step.lease_ref is not None
    lease, target = _resolve(registry, step.lease_ref)
    row = await store.get_resource(reserved_id)
    call = lease_call(registry, lease, target, clock, key=step.idempotency_key, run_id=step.run_id)
    if isinstance(row.payload, dict) and "saved" in row.payload:
        saved = row.payload["saved"]
    else:
        saved = await store.save_lease_value(reserved_id, await maybe_await(lease.read_fn(call)), clock.now())
    assert lease.write_fn is not None
    await maybe_await(lease.write_fn(call, step.params["value"]))
    now = clock.now()
    hold = step.params.get("for")
    until = now + timedelta(seconds=float(hold)) if hold else None
    return Outcome(
        step=step,
        status=StepStatus.SUCCEEDED,
        at=now,
        output={"lease": step.lease_ref, "saved": saved, "value": step.params["value"]},
        confirm_lease=True,
        lease_until=until,
    )


async def restore(registry: Registry, clock: Clock, row: ResourceRow, written: list[Any] | None) -> Changed | None:
    """Give a borrowed value back from the row's saved value, only over a value the run's
    borrows wrote (`written`, DESIGN §12): what the world shows is read first, and a value
    someone set since (a person, by hand) is left alone. Answers None when the saved value
    was written or is shown already, else what was found and left alone. `written` None
    gives back without comparing.

    A row without a saved value was reserved but never written over: there is nothing
    to give back, and marking it reverted is right.
    """
    if not (isinstance(row.payload, dict) and "saved" in row.payload):
        return None
    lease, target = _resolve(registry, row.ref)
    give_back = lease.restore_fn or lease.write_fn
    assert give_back is not None
    call = lease_call(registry, lease, target, clock, key=restore_key(row), run_id=row.run_id)
    saved = row.payload["saved"]
    if written is not None:
        shown = await maybe_await(lease.read_fn(call))
        if shown == saved:
            return None
        if shown not in written:
            log.warning("borrowed value changed since: left alone", run_id=row.run_id, ref=row.ref, shown=shown)
            return Changed(shown)
    await maybe_await(give_back(call, saved))
    return None


@dataclass(frozen=True)
class Changed:
    """A restore that found the world showing neither the saved value nor the borrow's."""

    shown: Any


async def sweep_expired(
    store: Store, registry: Registry, clock: Clock, claim_ttl: float = 60.0, *, incarnation: str = "sweeper"
) -> int:
    """Restore every lease past its `until`, even while its run goes on.

    Every worker sweeps; each row is claimed first under a token of its own, so one of
    them restores it, and its run's cleanup leaves it alone meanwhile. The restore has a
    deadline of a third of the claim, so the claim outlives the call: a restore that
    lands late cannot land after the row was freed and its target borrowed again.
    """
    restored = 0
    for row in await store.expired_leases(clock.now()):
        token = mint_token(incarnation)
        claimed_at = clock.now()
        if not await store.claim_expired_lease(row.id, token, claimed_at, claim_ttl):
            continue  # another worker is restoring it, or the run's cleanup will
        # The claim runs from when it was asked for, which a slow database may have made
        # a while ago: the restore must end well before the claim does, or not begin.
        left = (claimed_at + timedelta(seconds=claim_ttl) - clock.now()).total_seconds()
        budget = min(claim_ttl / 3, left / 2)
        try:
            if budget <= 0:
                raise TimeoutError
            async with clock.timeout(budget):
                await restore(registry, clock, row, await store.values_written(row.run_id, row.ref))
        except Exception as exc:  # the sweeper must not stop on one bad lease
            error = f"no answer within {max(budget, 0):g}s" if isinstance(exc, TimeoutError) else str(exc)
            log.warning("lease restore failed", run_id=row.run_id, ref=row.ref, error=error)
            await store.release_lease_row(row.id, token, f"expiry restore failed: {error}", clock.now())
            continue
        try:
            await store.mark_lease_restored(row.id, token, clock.now())
        except ClaimLost as exc:
            log.warning("lease restore not recorded", run_id=row.run_id, ref=row.ref, error=exc.message)
            continue
        log.info("lease expired and restored", run_id=row.run_id, ref=row.ref)
        restored += 1
    return restored

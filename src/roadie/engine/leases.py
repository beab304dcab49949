"""Leases: borrowing a world setting, giving it back, and the expiry sweeper.

The order of a borrow is what makes it safe to crash anywhere: the lease's row is
reserved when its step is claimed (before anything), the value about to be overwritten
is saved into that row (before the write), and only then is the world written. A retry
finds the saved value and keeps it, because what it would read now may be its own
borrowed value; it reads only to compare before it writes again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from roadie.clock import Clock
from roadie.errors import ClaimLost, PermanentError, RetryableError
from roadie.log import get_logger
from roadie.registry import LeaseCall, Registry
from roadie.registry.module import Lease, maybe_await
from roadie.states import LAYER_KIND, StepStatus
from roadie.store import Outcome, Store, mint_token
from roadie.store.rows import ResourceRow, StepRow
from roadie.store.stacks import Layer, Stack

log = get_logger(__name__)


def lease_ref(registry: Registry, params: dict[str, Any]) -> str:
    """The ledger ref of the target a `core.lease` step borrows: `lease` or `lease#target`."""
    lease = registry.lease(str(params["lease"]))
    target = params.get("target")
    if lease.targeted and target is None:
        raise PermanentError(f"lease {lease.id} is targeted: say which target")
    if not lease.targeted and target is not None:
        raise PermanentError(f"lease {lease.id} takes no target")
    return lease.ref(None if target is None else str(target))


def borrow_params(registry: Registry, params: dict[str, Any]) -> dict[str, Any]:
    """A `core.lease` step's params as its step keeps them: a borrow of a lease that stacks
    always names its layer's priority (0 unless given), which is how the ledger knows it
    is a layer; a priority for a lease that does not stack is refused."""
    lease = registry.lease(str(params["lease"]))
    if lease.stacks:
        return {**params, "priority": params.get("priority") or 0}
    if params.get("priority") is not None:
        raise PermanentError(f"lease {lease.id} does not stack: a priority is only for a lease that stacks")
    return params


def _resolve(registry: Registry, ref: str) -> tuple[Lease, str | None]:
    found = registry.lease_for_ref(ref)
    if found is None:
        raise PermanentError(f"no module registers the lease {ref!r}")
    return found


def lease_call(
    registry: Registry,
    lease: Lease,
    target: str | None,
    clock: Clock,
    *,
    key: str | None,
    run_id: int | None,
    fence: int = 0,
) -> LeaseCall:
    return LeaseCall(
        lease=lease.id,
        target=target,
        state=registry.state(lease.module.name),
        clock=clock,
        idempotency_key=key,
        run_id=run_id,
        fence=fence,
    )


def restore_key(row: ResourceRow) -> str:
    """The idempotency key of giving a borrowed value back: one per ledger row, so a
    restore retried after a crash is the same restore."""
    return f"restore-{row.run_id}-{row.id}"


async def borrow(
    store: Store, registry: Registry, clock: Clock, step: StepRow, reserved_id: int, *, fence: int
) -> Outcome:
    """Carry out a `core.lease` step whose row `reserved_id` is already reserved, under the
    step claim's `fence` (a layer is written under its stack's own)."""
    assert step.lease_ref is not None
    lease, target = _resolve(registry, step.lease_ref)
    row = await store.get_resource(reserved_id)
    call = lease_call(registry, lease, target, clock, key=step.idempotency_key, run_id=step.run_id, fence=fence)
    if step.layered:
        return await _push(store, lease, call, step, row, clock)
    shown = await maybe_await(lease.read_fn(call))
    left_alone: dict[str, Any] = {}
    if isinstance(row.payload, dict) and "saved" in row.payload:
        # A retry: an earlier attempt saved what the world showed, and may have written
        # the borrow. Compare before write (DESIGN §12, §13): the world showing neither the
        # saved value nor one of the run's borrows of it was set by someone since, and is
        # left alone and reported, as a restore or a re-apply would leave it.
        saved = row.payload["saved"]
        if shown != saved and shown not in await store.values_written(step.run_id, step.lease_ref):
            log.warning("borrowed value changed since: left alone", run_id=step.run_id, ref=row.ref, shown=shown)
            left_alone = {"left_alone": shown}
    else:
        saved = await store.save_lease_value(reserved_id, shown, clock.now(), step_id=step.id, token=step.claim_token)
    assert lease.write_fn is not None
    if not left_alone:
        await maybe_await(lease.write_fn(call, step.params["value"]))
    now = clock.now()
    hold = step.params.get("for")
    until = now + timedelta(seconds=float(hold)) if hold else None
    return Outcome(
        step=step,
        status=StepStatus.SUCCEEDED,
        at=now,
        output={"lease": step.lease_ref, "saved": saved, "value": step.params["value"], **left_alone},
        confirm_lease=True,
        lease_until=until,
    )


async def restore(
    store: Store, registry: Registry, clock: Clock, row: ResourceRow, deadline: float, *, fence: int
) -> Changed | None:
    """Give a borrowed value back from the row's saved value, only over a value the run's
    borrows wrote (DESIGN §12): what the world shows is read first, and a value someone
    set since (a person, by hand) is left alone. Answers None when the saved value was
    written or is shown already, else what was found and left alone. A layer of a lease
    that stacks is popped instead, its stack held for a few times `deadline`, the time the
    caller gives each call. The value is written under `fence`, the row claim's (a layer
    under its stack's).

    A row without a saved value was reserved but never written over: there is nothing
    to give back, and marking it reverted is right.
    """
    if row.kind == LAYER_KIND:
        return await _pop(store, registry, clock, row, deadline)
    if not (isinstance(row.payload, dict) and "saved" in row.payload):
        return None
    lease, target = _resolve(registry, row.ref)
    give_back = lease.restore_fn or lease.write_fn
    assert give_back is not None
    call = lease_call(registry, lease, target, clock, key=restore_key(row), run_id=row.run_id, fence=fence)
    saved = row.payload["saved"]
    shown = await maybe_await(lease.read_fn(call))
    # A world that shows the saved value already is written to all the same: the write
    # carries this claim's fence, which the world then holds against the borrow's own.
    # A borrow whose claim lapsed before its write landed (a worker cut off from the
    # database, its call still on the wire) would otherwise land after this restore
    # and stay, with no row left to give it back.
    if shown != saved and shown not in await store.values_written(row.run_id, row.ref):
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
        fence = await store.claim_expired_lease(row.id, token, claimed_at, claim_ttl)
        if fence is None:
            continue  # another worker is restoring it, or the run's cleanup will
        # The claim runs from when it was asked for, which a slow database may have made
        # a while ago: the restore must end well before the claim does, or not begin.
        left = (claimed_at + timedelta(seconds=claim_ttl) - clock.now()).total_seconds()
        budget = min(claim_ttl / 3, left / 2)
        try:
            if budget <= 0:
                raise TimeoutError
            async with clock.timeout(budget):
                await restore(store, registry, clock, row, budget, fence=fence)
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


# -- leases that stack -------------------------------------------------------------------
# The stack of a target is changed by one owner at a time (its claim): what the world
# should show is worked out from the layers, what is about to be written is kept, the
# world is written, and what it shows is kept. A change that dies half way is finished by
# the next, which finds the world showing a value Roadie wrote (DESIGN §11, §12).

STACK_CLAIM_FACTOR = 3  # a stack's claim lasts this many of its changer's call deadlines


class StackBusy(RetryableError):
    """Another run is changing what the world shows of this lease: try again shortly."""


def stack_ref(row: ResourceRow) -> str:
    """The lease target a lease row gives back: its ref, or for a `@layer` row the target
    it is a layer of."""
    if row.kind == LAYER_KIND and isinstance(row.payload, dict):
        return str(row.payload["lease"])
    return row.ref


async def _claim_stack(
    store: Store, ref: str, clock: Clock, ttl: float, patience: float, *, step: StepRow | None = None
) -> Stack:
    """Take the stack of `ref` for `ttl` seconds, for `step` (only while its claim holds);
    while another holds it (two runs ending at once), wait for it up to `patience`
    seconds, then `StackBusy`."""
    token = mint_token("stack")
    waited, pause = 0.0, 0.02
    for_step = (step.id, step.claim_token) if step is not None else None
    while True:
        stack = await store.claim_stack(ref, token, clock.now(), ttl, for_step=for_step)
        if stack is not None:
            return stack
        if waited >= patience:
            raise StackBusy(f"{ref} is being changed by another run", next_retry_delay=1.0)
        await clock.sleep(pause)
        waited += pause
        pause = min(pause * 2, 1.0)


async def _push(store: Store, lease: Lease, call: LeaseCall, step: StepRow, row: ResourceRow, clock: Clock) -> Outcome:
    """Put the step's layer in, and make the world show the top layer."""
    assert step.lease_ref is not None
    assert lease.write_fn is not None
    # The claim outlives the step's calls, but not the step's own claim: a worker that dies
    # mid-change leaves the stack to whoever takes its step over.
    left = (step.claim_expires - clock.now()).total_seconds() if step.claim_expires else 0.0
    ttl = max(step.timeout, min(step.timeout * STACK_CLAIM_FACTOR, left))
    stack = await _claim_stack(store, step.lease_ref, clock, ttl, step.timeout / 2, step=step)
    try:
        if stack.exclusive is not None:
            raise PermanentError(f"{step.lease_ref} is already held by run {stack.exclusive} (not as a layer)")
        mine = Layer(
            row.id, row.run_id, int(step.params["priority"]), {**(row.payload or {}), "value": step.params["value"]}
        )
        # Read first, as every borrow does (a module's key ledger learns the key before its
        # apply). For the first layer (or the first again, after the stack emptied) what
        # the world shows is what comes back when the last layer goes, unless it shows what
        # Roadie wrote (a change that died half way): then the base stays. A retry of this
        # step finds its own layer in effect, and the base is not touched.
        seen = await maybe_await(lease.read_fn(call))
        base = None
        if not any(x.in_effect for x in stack.layers):
            base = stack.base if stack.base is not None and seen in stack.ours() else (seen,)
        top = stack.top(adding=mine) if base is None else (step.params["value"],)
        # Written when this layer is on top, or when a change died before the world showed
        # what it was to (its `writing` is kept): then the top is written again. Compare
        # before write, as a restore does: over a layer in effect, a world showing neither
        # the value from before the first layer nor one Roadie wrote was set by hand since,
        # and is left alone (the layer goes in, the world is not written) and reported.
        writes = top == (step.params["value"],) or stack.writing is not None
        changed = None
        if writes and base is None and seen not in stack.ours() and (stack.base is None or seen != stack.base[0]):
            log.warning("stacked value changed since: left alone", run_id=step.run_id, ref=step.lease_ref, shown=seen)
            changed = Changed(seen)
            writes = False
        await store.change_stack(
            stack, clock.now(), layer=row.id, payload=mine.payload, writing=top if writes else None, base=base
        )
        if writes and top is not None:
            await maybe_await(lease.write_fn(replace(call, fence=stack.fence), top[0]))
        await store.settle_stack(stack, clock.now(), shown=top if writes else None)
    except asyncio.CancelledError:
        raise  # a call cut short may land yet: the claim runs out, it is not let go
    except Exception:
        await store.release_stack(stack)
        raise
    now = clock.now()
    hold = step.params.get("for")
    return Outcome(
        step=step,
        status=StepStatus.SUCCEEDED,
        at=now,
        output={
            "lease": step.lease_ref,
            "priority": mine.priority,
            "value": step.params["value"],
            "shown": seen if changed is not None else (top[0] if top else None),
            **({"left_alone": changed.shown} if changed is not None else {}),
        },
        confirm_lease=True,
        lease_until=now + timedelta(seconds=float(hold)) if hold else None,
    )


async def _pop(store: Store, registry: Registry, clock: Clock, row: ResourceRow, deadline: float) -> Changed | None:
    """Take a run's layer out, wherever it sits, and make the world show what is on top
    now: the next layer, or the value from before the first once none is left. Only over
    a value Roadie wrote: one set by hand meanwhile is left alone, and answered."""
    ref = stack_ref(row)
    lease, target = _resolve(registry, ref)
    give_back = lease.restore_fn or lease.write_fn
    assert give_back is not None
    stack = await _claim_stack(store, ref, clock, deadline * STACK_CLAIM_FACTOR, deadline / 2)
    try:
        mine = stack.layer(row.id)
        payload = {**(mine.payload if mine else row.payload or {}), "popped": True}
        top = stack.top(without=row.id)
        if top is None or "value" not in payload:
            # Reserved and never put in (its borrow never got that far): the world shows
            # nothing of it.
            await store.change_stack(stack, clock.now(), layer=row.id, payload=payload, writing=None)
            await store.settle_stack(stack, clock.now(), shown=None)
            return None
        call = lease_call(registry, lease, target, clock, key=restore_key(row), run_id=row.run_id, fence=stack.fence)
        shown = await maybe_await(lease.read_fn(call))
        changed = None
        # Written even where the world shows it already, to put the stack's fence in the
        # world before a push whose claim lapsed can land (as `restore` does).
        writes = shown == top[0] or shown in stack.ours()
        if not writes:
            log.warning("stacked value changed since: left alone", run_id=row.run_id, ref=ref, shown=shown)
            changed = Changed(shown)
        await store.change_stack(stack, clock.now(), layer=row.id, payload=payload, writing=top if writes else None)
        if writes:
            await maybe_await(give_back(call, top[0]))
        await store.settle_stack(stack, clock.now(), shown=None if changed else top)
        return changed
    except asyncio.CancelledError:
        raise
    except Exception:
        await store.release_stack(stack)
        raise

"""Lease stacks: the layers of a lease several runs borrow at once, and who changes it.

A layer is a run's `@layer` row (its ref is the borrowing step's key, its payload names
the lease, the priority and, once it is in effect, the value). The stack's own row keeps
what the world showed before the first layer, what Roadie last wrote and what it is about
to write, and the claim of whoever is changing it now (DESIGN §11).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select, update

from roadie.errors import ClaimLost
from roadie.states import LAYER_KIND, OVERRIDE_KIND, StepStatus
from roadie.store import statements
from roadie.store.connector import Connector
from roadie.store.fences import mint_fence
from roadie.store.tables import LIVE_STATES, lease_stacks, run_resources, steps

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class Layer:
    """One run's borrow of a stacked lease, as its `@layer` row says."""

    resource_id: int
    run_id: int
    priority: int
    payload: dict[str, Any]

    @property
    def in_effect(self) -> bool:
        """Its value was set (a borrow got that far) and it has not been popped since."""
        return "value" in self.payload and not self.payload.get("popped")

    @property
    def value(self) -> Any:
        return self.payload.get("value")


@dataclass(frozen=True)
class Stack:
    """A stacked lease's target as its claimant found it: `base`, `shown` and `writing` are
    `(value,)` or None for none, so a JSON null stays a value."""

    ref: str
    token: str
    base: tuple[Any] | None
    shown: tuple[Any] | None
    writing: tuple[Any] | None
    layers: list[Layer]  # the target's live layers, popped or not, oldest first
    exclusive: int | None  # a run holding the target as an exclusive lease (a module changed its mind)
    fence: int = 0  # minted with the claim: the writes made under it carry it

    def layer(self, resource_id: int) -> Layer | None:
        return next((x for x in self.layers if x.resource_id == resource_id), None)

    def top(self, *, without: int | None = None, adding: Layer | None = None) -> tuple[Any] | None:
        """What the world should show: the value of the highest layer in effect (a tie goes
        to the later borrow), or the base once none is left; None when there is neither."""
        layers = [
            x
            for x in self.layers
            if x.in_effect and x.resource_id not in (without, getattr(adding, "resource_id", None))
        ]
        if adding is not None:
            layers.append(adding)
        if not layers:
            return self.base
        best = max(layers, key=lambda x: (x.priority, x.resource_id))
        return (best.value,)

    def ours(self) -> list[Any]:
        """Every value Roadie wrote or may have written here: a world showing one of them
        shows Roadie's doing, not a person's."""
        found = [x.value for x in self.layers if "value" in x.payload]
        found.extend(v[0] for v in (self.shown, self.writing) if v is not None)
        return found


def _wrap(value: tuple[Any] | None) -> dict[str, Any] | None:
    return None if value is None else {"value": value[0]}


def _unwrap(stored: Any) -> tuple[Any] | None:
    return (stored["value"],) if isinstance(stored, dict) and "value" in stored else None


class StackQueries(Connector):
    async def claim_stack(
        self, ref: str, token: str, now: datetime, ttl: float, *, for_step: tuple[int, str | None] | None = None
    ) -> Stack | None:
        """Take the right to change what the world shows of the stacked lease `ref` under
        `token`, and answer the stack as it is; None while another holds it (its claim
        runs out `ttl` after it was taken). Taken `for_step` (its id and claim token), it is
        taken only while that step's claim holds, in the same transaction: a worker whose
        step was taken over cannot take the stack, nor mint a fence, for it (`ClaimLost`)."""

        async def work(conn: AsyncConnection) -> Stack | None:
            if for_step is not None:
                held = await conn.execute(
                    select(steps.c.id)
                    .where(
                        steps.c.id == for_step[0],
                        steps.c.claim_token == for_step[1],
                        steps.c.status == StepStatus.RUNNING.value,
                        steps.c.claim_expires >= now,
                    )
                    .with_for_update()
                )
                if held.first() is None:
                    raise ClaimLost(f"step {for_step[0]}'s claim is gone: {ref} is not changed for it")
            await conn.execute(statements.insert_ignore(self.dialect, lease_stacks), [{"ref": ref, "updated_at": now}])
            taken = await conn.execute(
                update(lease_stacks)
                .where(
                    lease_stacks.c.ref == ref,
                    or_(
                        lease_stacks.c.claim_token.is_(None),
                        lease_stacks.c.claim_expires < now,
                        lease_stacks.c.claim_token == token,
                    ),
                )
                .values(claim_token=token, claim_expires=now + timedelta(seconds=ttl))
            )
            if taken.rowcount != 1:
                return None
            row = (await conn.execute(select(lease_stacks).where(lease_stacks.c.ref == ref))).one()
            layers = await conn.execute(
                select(run_resources.c.id, run_resources.c.run_id, run_resources.c.payload)
                .join(steps, steps.c.id == run_resources.c.step_id)
                .where(
                    run_resources.c.kind == LAYER_KIND,
                    run_resources.c.state.in_(LIVE_STATES),
                    steps.c.lease_ref == ref,
                )
                .order_by(run_resources.c.id)
            )
            exclusive = (
                await conn.execute(
                    select(run_resources.c.run_id).where(
                        run_resources.c.owner == "core",
                        run_resources.c.kind == OVERRIDE_KIND,
                        run_resources.c.ref == ref,
                        run_resources.c.state.in_(LIVE_STATES),
                    )
                )
            ).scalar()
            return Stack(
                ref=ref,
                token=token,
                base=_unwrap(row.base),
                shown=_unwrap(row.shown),
                writing=_unwrap(row.writing),
                layers=[
                    Layer(r.id, r.run_id, int(r.payload.get("priority") or 0), r.payload)
                    for r in layers
                    if isinstance(r.payload, dict)
                ],
                exclusive=exclusive,
                fence=await mint_fence(conn),
            )

        result: Stack | None = await self._write("claim_stack", work)
        return result

    async def change_stack(
        self,
        stack: Stack,
        now: datetime,
        *,
        layer: int,
        payload: dict[str, Any],
        writing: tuple[Any] | None,
        base: tuple[Any] | None = None,
    ) -> None:
        """Before the world is written: a layer goes in (its value set) or out (popped), and
        what is about to be written is kept, with the base when this is the first layer.
        Claim: the stack's; raises `ClaimLost`, writing nothing, when it is gone."""
        values: dict[str, Any] = {"writing": _wrap(writing), "updated_at": now}
        if base is not None:
            values["base"] = _wrap(base)

        async def work(conn: AsyncConnection) -> None:
            await _fence(conn, stack, values)
            await conn.execute(
                update(run_resources).where(run_resources.c.id == layer).values(payload=payload, updated_at=now)
            )

        await self._write("change_stack", work)

    async def settle_stack(self, stack: Stack, now: datetime, *, shown: tuple[Any] | None) -> None:
        """The world was written (or left as it was): keep what it shows now, when known,
        and let the stack go. Claim: the stack's; a claim already gone raises `ClaimLost`."""
        values: dict[str, Any] = {"writing": None, "claim_token": None, "claim_expires": None, "updated_at": now}
        if shown is not None:
            values["shown"] = _wrap(shown)

        async def work(conn: AsyncConnection) -> None:
            await _fence(conn, stack, values)

        await self._write("settle_stack", work)

    async def release_stack(self, stack: Stack) -> None:
        """Let the stack go without changing what it says (a world call failed)."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(lease_stacks)
                .where(lease_stacks.c.ref == stack.ref, lease_stacks.c.claim_token == stack.token)
                .values(claim_token=None, claim_expires=None)
            )

        await self._write("release_stack", work)

    async def stack_shows(self, ref: str) -> tuple[Any] | None:
        """What Roadie last made the world show of the stacked lease `ref`, if anything."""

        async def work(conn: AsyncConnection) -> tuple[Any] | None:
            return _unwrap((await conn.execute(select(lease_stacks.c.shown).where(lease_stacks.c.ref == ref))).scalar())

        result: tuple[Any] | None = await self._read(work)
        return result


async def _fence(conn: AsyncConnection, stack: Stack, values: dict[str, Any]) -> None:
    changed = await conn.execute(
        update(lease_stacks)
        .where(lease_stacks.c.ref == stack.ref, lease_stacks.c.claim_token == stack.token)
        .values(**values)
    )
    if changed.rowcount != 1:
        raise ClaimLost(f"the stack of {stack.ref} is no longer held by this change")

"""Minting fences: numbers that only grow, one per claim to change the world.

A fence is minted in the transaction that takes (or confirms) the claim a call to a
module is made under, after the claim's rows are locked. The owner the claim was taken
from minted its own fence while it held the claim, so earlier: a module that remembers the
highest fence it has accepted for a step's key or a lease target can refuse the calls of
an owner since replaced (docs/protocol.md §4, rule 7; DESIGN §11).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select, update

from roadie.store.connector import Connector
from roadie.store.tables import fence_counter, fence_sequence

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


async def mint_fence(conn: AsyncConnection) -> int:
    """A fence higher than every one minted before, in `conn`'s transaction."""
    if conn.dialect.name == "sqlite":
        # One writer at a time: the row is the counter, and the transaction holds it.
        minted = await conn.scalar(
            update(fence_counter)
            .where(fence_counter.c.id == 1)
            .values(value=fence_counter.c.value + 1)
            .returning(fence_counter.c.value)
        )
    else:
        minted = await conn.scalar(select(fence_sequence.next_value()))
    if minted is None:  # pragma: no cover - the migration puts the row in
        raise RuntimeError("the fence counter has no row: the database was not migrated")
    return int(minted)


class FenceQueries(Connector):
    async def new_fence(self) -> int:
        """A fence for calls that no claim stands behind but the moment they are decided
        (the orphan sweep's reverts): higher than any owner's before it."""
        result: int = await self._write("new_fence", mint_fence)
        return result

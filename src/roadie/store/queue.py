"""The pull transport's queries: the work queue of calls for modules that poll, and what
those modules announced about themselves.

Kept apart from `Store` because only the remote transport uses them; they run through the
store's own transactions and write points.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from roadie.store import dialects
from roadie.store.rows import StepRow, from_row
from roadie.store.store import Store
from roadie.store.tables import remote_calls, remote_modules, steps


@dataclass(frozen=True)
class QueuedCall:
    id: int
    module: str
    kind: str
    idempotency_key: str
    body: dict[str, Any]
    deliveries: int


def call_hash(module: str, kind: str, key: str, body: dict[str, Any]) -> str:
    """The same call made again is the same work: a retried dispatch differs only by its
    attempt, and must find the call (and any answer to it) already there."""
    same = {k: v for k, v in body.items() if k != "attempt"}
    canonical = json.dumps([module, kind, key, same], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class QueueStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def enqueue(self, module: str, kind: str, key: str, body: dict[str, Any], now: datetime) -> int:
        """Put a call on the queue (or find it there already) and answer its id."""
        digest = call_hash(module, kind, key, body)
        values = {
            "module": module,
            "kind": kind,
            "idempotency_key": key,
            "call_hash": digest,
            "body": body,
            "created_at": now,
            "visible_at": now,
            "deliveries": 0,
        }

        async def work(conn: AsyncConnection) -> int:
            await conn.execute(dialects.insert_ignore(self.store.dialect, remote_calls).values(**values))
            found = (
                await conn.execute(
                    select(remote_calls.c.id).where(remote_calls.c.module == module, remote_calls.c.call_hash == digest)
                )
            ).scalar_one()
            return int(found)

        result: int = await self.store._write("enqueue_call", work)
        return result

    async def take(self, module: str, limit: int, now: datetime, visibility: float) -> list[QueuedCall]:
        """Hand out up to `limit` calls that are due, hiding each for `visibility` seconds.

        Two pollers never get the same call within its visibility: the rows are locked
        and skipped (PostgreSQL, MariaDB) or the write is serialised (SQLite)."""
        due = [remote_calls.c.module == module, remote_calls.c.answered_at.is_(None), remote_calls.c.visible_at <= now]
        hidden_until = now + timedelta(seconds=visibility)

        async def work(conn: AsyncConnection) -> list[QueuedCall]:
            query = select(remote_calls.c.id).where(*due).order_by(remote_calls.c.id).limit(limit)
            if self.store.dialect != "sqlite":
                query = query.with_for_update(skip_locked=True)
            ids = list((await conn.execute(query)).scalars())
            if not ids:
                return []
            await conn.execute(
                update(remote_calls)
                .where(remote_calls.c.id.in_(ids))
                .values(visible_at=hidden_until, deliveries=remote_calls.c.deliveries + 1)
            )
            taken = select(remote_calls).where(remote_calls.c.id.in_(ids)).order_by(remote_calls.c.id)
            rows = await conn.execute(taken)
            return [
                QueuedCall(r.id, r.module, r.kind, r.idempotency_key, dict(r.body), int(r.deliveries)) for r in rows
            ]

        result: list[QueuedCall] = await self.store._write("take_calls", work)
        return result

    async def answer(self, module: str, call_id: int, status: int, body: Any, now: datetime) -> bool:
        """Keep a call's answer. False when there is no such unanswered call (already
        answered by an earlier delivery, or expired): the answer is not needed."""

        async def work(conn: AsyncConnection) -> bool:
            result = await conn.execute(
                update(remote_calls)
                .where(
                    remote_calls.c.id == call_id,
                    remote_calls.c.module == module,
                    remote_calls.c.answered_at.is_(None),
                )
                .values(answered_at=now, answer_status=status, answer=body)
            )
            return bool(result.rowcount)

        answered: bool = await self.store._write("answer_call", work)
        return answered

    async def answers(self, call_ids: Sequence[int]) -> dict[int, tuple[int, Any]]:
        """The answered calls among `call_ids`: id -> (status, body)."""
        if not call_ids:
            return {}

        async def work(conn: AsyncConnection) -> dict[int, tuple[int, Any]]:
            rows = await conn.execute(
                select(remote_calls.c.id, remote_calls.c.answer_status, remote_calls.c.answer).where(
                    remote_calls.c.id.in_(list(call_ids)), remote_calls.c.answered_at.is_not(None)
                )
            )
            return {int(r.id): (int(r.answer_status), r.answer) for r in rows}

        result: dict[int, tuple[int, Any]] = await self.store._read(work)
        return result

    async def consume(self, call_ids: Sequence[int]) -> None:
        """Answers that reached their caller are done with."""
        if not call_ids:
            return

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                delete(remote_calls).where(
                    remote_calls.c.id.in_(list(call_ids)), remote_calls.c.answered_at.is_not(None)
                )
            )

        await self.store._write("consume_calls", work)

    async def expire(self, older_than: datetime) -> int:
        """Drop calls made before `older_than`: their callers gave up on them long ago."""

        async def work(conn: AsyncConnection) -> int:
            result = await conn.execute(delete(remote_calls).where(remote_calls.c.created_at < older_than))
            return int(result.rowcount or 0)

        dropped: int = await self.store._write("expire_calls", work)
        return dropped

    async def waiting(self, module: str, now: datetime) -> int:
        """How many calls for `module` are due and not handed out."""

        async def work(conn: AsyncConnection) -> int:
            rows = await conn.execute(
                select(remote_calls.c.id).where(
                    remote_calls.c.module == module,
                    remote_calls.c.answered_at.is_(None),
                    remote_calls.c.visible_at <= now,
                )
            )
            return len(rows.all())

        count: int = await self.store._read(work)
        return count

    # -- what pulling modules announced ---------------------------------------------

    async def announce(self, name: str, manifest: dict[str, Any], now: datetime) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(remote_modules).where(remote_modules.c.name == name))
            await conn.execute(
                insert(remote_modules).values(name=name, manifest=manifest, announced_at=now, polled_at=now)
            )

        await self.store._write("announce_module", work)

    async def announced(self, name: str) -> dict[str, Any] | None:
        async def work(conn: AsyncConnection) -> dict[str, Any] | None:
            row = (await conn.execute(select(remote_modules.c.manifest).where(remote_modules.c.name == name))).first()
            return None if row is None else dict(row.manifest)

        result: dict[str, Any] | None = await self.store._read(work)
        return result

    async def step_by_key(self, key: str) -> StepRow | None:
        async def work(conn: AsyncConnection) -> StepRow | None:
            row = (await conn.execute(select(steps).where(steps.c.idempotency_key == key))).first()
            return None if row is None else from_row(StepRow, row)

        result: StepRow | None = await self.store._read(work)
        return result

"""The pull transport's queries: the work queue of calls for modules that poll, and what
those modules announced about themselves.

Kept apart from `Store` because only the remote transport uses them; they run through the
store's own transactions and write points.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from roadie.store import statements
from roadie.store.rows import StepRow, from_row
from roadie.store.store import Store
from roadie.store.tables import remote_calls, remote_modules, seen_requests, steps

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class QueuedCall:
    id: int
    module: str
    kind: str
    idempotency_key: str
    body: dict[str, Any]
    deliveries: int
    token: str = ""  # this delivery's token: only an answer naming it is kept


@dataclass(frozen=True)
class AnswerTaken:
    """Whether a posted answer was kept, and if not, why (for the module's log)."""

    accepted: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.accepted


def mint_delivery_token() -> str:
    """A token for one delivery of one call: unguessable, so that no other delivery (nor
    anyone who saw an earlier one) can name it."""
    return secrets.token_hex(16)


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
            await conn.execute(statements.insert_ignore(self.store.dialect, remote_calls).values(**values))
            found = (
                await conn.execute(
                    select(remote_calls.c.id, remote_calls.c.withdrawn_at).where(
                        remote_calls.c.module == module, remote_calls.c.call_hash == digest
                    )
                )
            ).one()
            if found.withdrawn_at is not None:
                # An earlier caller gave up on this call; this one wants it again (a retry
                # under the same key). It is queued afresh: a delivery handed out before the
                # withdrawal keeps its old token, which no longer names the call.
                await conn.execute(
                    update(remote_calls)
                    .where(
                        remote_calls.c.id == found.id,
                        remote_calls.c.withdrawn_at.is_not(None),
                        remote_calls.c.answered_at.is_(None),
                    )
                    .values(
                        withdrawn_at=None,
                        withdrawn_reason=None,
                        delivery_token=None,
                        visible_at=now,
                        created_at=now,
                        body=body,
                    )
                )
            return int(found.id)

        result: int = await self.store._write("enqueue_call", work)
        return result

    async def take(self, module: str, limit: int, now: datetime, visibility: float) -> list[QueuedCall]:
        """Hand out up to `limit` calls that are due, in queue order, hiding each for
        `visibility` seconds under a delivery token minted for this take.

        Two pollers never get the same call within its visibility: the rows are locked
        and skipped (PostgreSQL, MariaDB) or the write is serialised (SQLite). A call that
        was answered or withdrawn in between is not handed out: each row's write is fenced
        on both, and its row count checked."""
        due = [
            remote_calls.c.module == module,
            remote_calls.c.answered_at.is_(None),
            remote_calls.c.withdrawn_at.is_(None),
            remote_calls.c.visible_at <= now,
        ]
        hidden_until = now + timedelta(seconds=visibility)

        async def work(conn: AsyncConnection) -> list[QueuedCall]:
            query = select(remote_calls.c.id).where(*due).order_by(remote_calls.c.id).limit(limit)
            if self.store.dialect != "sqlite":
                query = query.with_for_update(skip_locked=True)
            ids = list((await conn.execute(query)).scalars())
            tokens: dict[int, str] = {}
            for call_id in ids:
                token = mint_delivery_token()
                handed = await conn.execute(
                    update(remote_calls)
                    .where(
                        remote_calls.c.id == call_id,
                        remote_calls.c.answered_at.is_(None),
                        remote_calls.c.withdrawn_at.is_(None),
                    )
                    .values(visible_at=hidden_until, deliveries=remote_calls.c.deliveries + 1, delivery_token=token)
                )
                if handed.rowcount == 1:
                    tokens[call_id] = token
            if not tokens:
                return []
            taken = select(remote_calls).where(remote_calls.c.id.in_(list(tokens))).order_by(remote_calls.c.id)
            rows = await conn.execute(taken)
            return [
                QueuedCall(r.id, r.module, r.kind, r.idempotency_key, dict(r.body), int(r.deliveries), tokens[r.id])
                for r in rows
            ]

        result: list[QueuedCall] = await self.store._write("take_calls", work)
        return result

    async def answer(
        self, module: str, call_id: int, status: int, body: Any, now: datetime, token: str | None = None
    ) -> AnswerTaken:
        """Keep a call's answer, if it comes from the delivery in hand.

        Claim: the delivery `token` the take minted. The write names it (and that the call
        is neither answered nor withdrawn) and its row count is checked, so the answer of
        a delivery handed out again since, or of a call its caller gave up on, is refused
        with the reason. An answer naming no token (a module older than delivery tokens) is
        kept from any delivery of a call that is still wanted."""
        fence = [
            remote_calls.c.id == call_id,
            remote_calls.c.module == module,
            remote_calls.c.answered_at.is_(None),
            remote_calls.c.withdrawn_at.is_(None),
            remote_calls.c.delivery_token.is_not(None) if token is None else remote_calls.c.delivery_token == token,
        ]

        async def work(conn: AsyncConnection) -> AnswerTaken:
            result = await conn.execute(
                update(remote_calls).where(*fence).values(answered_at=now, answer_status=status, answer=body)
            )
            if result.rowcount == 1:
                return AnswerTaken(True)
            row = (
                await conn.execute(
                    select(remote_calls).where(remote_calls.c.id == call_id, remote_calls.c.module == module)
                )
            ).first()
            return AnswerTaken(False, _refusal(row, token))

        answered: AnswerTaken = await self.store._write("answer_call", work)
        return answered

    async def release(self, call_ids: Sequence[int], now: datetime) -> None:
        """Make calls handed out to a poller that hung up before reading them due again now."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(remote_calls)
                .where(remote_calls.c.id.in_(list(call_ids)), remote_calls.c.answered_at.is_(None))
                .values(visible_at=now)
            )

        await self.store._write("release_calls", work)

    async def withdraw(self, call_id: int, now: datetime, reason: str) -> bool:
        """Take back a call whose caller gave up on it (its deadline passed, its step or
        cleanup ended): it is never handed out again, and no answer to it is kept.

        Fenced on the call being unanswered and not withdrawn, row count checked: False
        when an answer was kept first (then the caller may still take it)."""

        async def work(conn: AsyncConnection) -> bool:
            result = await conn.execute(
                update(remote_calls)
                .where(
                    remote_calls.c.id == call_id,
                    remote_calls.c.answered_at.is_(None),
                    remote_calls.c.withdrawn_at.is_(None),
                )
                .values(withdrawn_at=now, withdrawn_reason=reason[:255], delivery_token=None)
            )
            return result.rowcount == 1

        withdrawn: bool = await self.store._write("withdraw_call", work)
        return withdrawn

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
                    remote_calls.c.withdrawn_at.is_(None),
                    remote_calls.c.visible_at <= now,
                )
            )
            return len(rows.all())

        count: int = await self.store._read(work)
        return count

    # -- what pulling modules announced ---------------------------------------------

    async def announce(self, name: str, manifest: dict[str, Any], now: datetime) -> None:
        """Keep what a module says it is. A module announces when it starts: the calls it
        held before (handed out, not answered) died with its last process, so they are due
        again at once, instead of after their visibility timeout. The module's key ledger
        answers any it had carried out; an answer from the old delivery is still kept until
        the call is handed out again, and refused after."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(remote_modules).where(remote_modules.c.name == name))
            await conn.execute(
                insert(remote_modules).values(name=name, manifest=manifest, announced_at=now, polled_at=now)
            )
            await conn.execute(
                update(remote_calls)
                .where(
                    remote_calls.c.module == name,
                    remote_calls.c.answered_at.is_(None),
                    remote_calls.c.withdrawn_at.is_(None),
                    remote_calls.c.deliveries > 0,
                    remote_calls.c.visible_at > now,
                )
                .values(visible_at=now)
            )

        await self.store._write("announce_module", work)

    async def first_sight(self, module: str, request_id: str, expires_at: datetime, now: datetime) -> bool:
        """Keep a signed request's id until `expires_at`; whether this is the first time it
        came (else it is a replay). One statement decides, so two gateways on one database
        that get the same request at once accept it once. Ids already expired go first."""

        async def work(conn: AsyncConnection) -> bool:
            await conn.execute(delete(seen_requests).where(seen_requests.c.expires_at < now))
            # A savepoint, not an insert-or-ignore: MariaDB counts a skipped duplicate as a
            # found row, so the row count could not tell a replay from a first sight.
            try:
                async with conn.begin_nested():
                    await conn.execute(
                        insert(seen_requests).values(module=module, request_id=request_id, expires_at=expires_at)
                    )
            except IntegrityError:
                return False
            return True

        result: bool = await self.store._write("seen_request", work)
        return result

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


def _refusal(row: Any, token: str | None) -> str:
    """Why an answer to `row` was not kept."""
    if row is None:
        return "no such call: its answer was collected already, or it expired"
    if row.answered_at is not None:
        return "the call was answered already"
    if row.withdrawn_at is not None:
        return f"the call was withdrawn: {row.withdrawn_reason or 'its caller gave up'}"
    if row.delivery_token is None:
        return "the call was never handed out"
    if token is not None and token != row.delivery_token:
        return "stale delivery: the call was handed out again since, under another token"
    return "the answer was not kept"

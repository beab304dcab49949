"""Notifications and their deliveries to webhooks.

A notification is written in the transaction that made it true (a run began, a run
ended, a cleanup finished), keyed so that a transaction run twice writes it once, with
one delivery for each webhook target known then (and not at all when none is known).
Senders claim deliveries under a token of their own, as every other claim in the store,
and each write after names it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, or_, select, update

from roadie.states import RunStatus
from roadie.store import dialects, statements
from roadie.store.connector import Connector, aware
from roadie.store.tables import deliveries, notifications, runs, webhook_targets

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

ENDED = {s.value for s in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)}


@dataclass(frozen=True)
class NewNotification:
    key: str  # one notification per key, however often the transaction that writes it runs
    kind: str  # run.{started,succeeded,failed,cancelled} | cleanup.{complete,incomplete,rolled_back,held}
    run_id: int | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class Delivery:
    """A delivery claimed for sending, with what it carries."""

    id: int
    target: str
    token: str
    attempts: int  # made before this one
    notification_id: int
    kind: str
    payload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class DeliveryRow:
    id: int
    target: str
    state: str
    attempts: int
    next_at: datetime
    last_error: str | None
    kind: str
    run_id: int | None
    created_at: datetime


class NotifyQueries(Connector):
    async def register_webhooks(self, names: Iterable[str], now: datetime) -> None:
        """Make these targets known, so that every notification written from now on gets a
        delivery for each. One registered before keeps its first date."""
        rows = [{"name": name, "registered_at": now} for name in names]
        if not rows:
            return

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(statements.insert_ignore(self.dialect, webhook_targets), rows)

        await self._write("register_webhooks", work)

    async def claim_deliveries(
        self, targets: Iterable[str], token: str, now: datetime, ttl: float, limit: int = 20
    ) -> list[Delivery]:
        """Take the webhooks among `targets` that have something due and that no other
        sender holds, and up to `limit` of their due deliveries, oldest first, for `ttl`
        seconds. One sender holds a webhook at a time, so what it is sent leaves in the
        order it was written whichever worker sends it; `release_webhooks` gives the
        webhooks back. Each delivery's claim is fenced as well, on the row being free still
        (its rows are locked and skipped on PostgreSQL and MariaDB; SQLite serialises)."""
        wanted = list(targets)
        if not wanted:
            return []
        until = now + timedelta(seconds=ttl)
        free = or_(deliveries.c.claim_token.is_(None), deliveries.c.claim_expires <= now)
        due = and_(deliveries.c.target.in_(wanted), deliveries.c.state == "pending", deliveries.c.next_at <= now, free)
        unheld = or_(webhook_targets.c.claim_token.is_(None), webhook_targets.c.claim_expires <= now)

        async def work(conn: AsyncConnection) -> list[Delivery]:
            waiting = list((await conn.execute(select(deliveries.c.target).where(due).distinct())).scalars())
            if not waiting:
                return []
            await conn.execute(
                update(webhook_targets)
                .where(webhook_targets.c.name.in_(waiting), unheld)
                .values(claim_token=token, claim_expires=until)
            )
            held = select(webhook_targets.c.name).where(
                webhook_targets.c.name.in_(waiting), webhook_targets.c.claim_token == token
            )
            mine = list((await conn.execute(held)).scalars())
            if not mine:
                return []
            ours = and_(due, deliveries.c.target.in_(mine))
            query = select(deliveries.c.id).where(ours).order_by(deliveries.c.id).limit(limit)
            query = dialects.skip_locked(self.dialect, query)
            ids = list((await conn.execute(query)).scalars())
            if not ids:
                await conn.execute(
                    update(webhook_targets)
                    .where(webhook_targets.c.claim_token == token)
                    .values(claim_token=None, claim_expires=None)
                )
                return []
            await conn.execute(
                update(deliveries).where(deliveries.c.id.in_(ids), ours).values(claim_token=token, claim_expires=until)
            )
            taken = (
                select(deliveries, notifications.c.kind, notifications.c.payload, notifications.c.created_at)
                .join(notifications, notifications.c.id == deliveries.c.notification_id)
                .where(deliveries.c.id.in_(ids), deliveries.c.claim_token == token)
                .order_by(deliveries.c.id)
            )
            return [
                Delivery(
                    id=r.id,
                    target=r.target,
                    token=token,
                    attempts=int(r.attempts),
                    notification_id=r.notification_id,
                    kind=r.kind,
                    payload=dict(r.payload),
                    created_at=_moment(r.created_at),
                )
                for r in await conn.execute(taken)
            ]

        result: list[Delivery] = await self._write("claim_deliveries", work)
        return result

    async def release_webhooks(self, token: str) -> None:
        """Give back the webhooks held under `token`, once what was taken with them is sent."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                update(webhook_targets)
                .where(webhook_targets.c.claim_token == token)
                .values(claim_token=None, claim_expires=None)
            )

        await self._write("release_webhooks", work)

    async def finish_delivery(
        self,
        delivery: Delivery,
        state: str,
        now: datetime,
        *,
        next_at: datetime | None = None,
        error: str | None = None,
    ) -> bool:
        """Record how an attempt went: `delivered`, `skipped`, `gave_up`, or `pending`
        again at `next_at`. Claim: the delivery's token. False, writing nothing, when the
        claim ran out and another sender took the delivery over."""

        async def work(conn: AsyncConnection) -> bool:
            changed = await conn.execute(
                update(deliveries)
                .where(deliveries.c.id == delivery.id, deliveries.c.claim_token == delivery.token)
                .values(
                    state=state,
                    attempts=deliveries.c.attempts + (0 if state == "skipped" else 1),
                    next_at=next_at or now,
                    last_error=error[:2000] if error else None,
                    claim_token=None,
                    claim_expires=None,
                    updated_at=now,
                )
            )
            return bool(changed.rowcount)

        result: bool = await self._write("finish_delivery", work)
        return result

    async def list_deliveries(self, run_id: int | None = None, limit: int = 100) -> list[DeliveryRow]:
        query = (
            select(deliveries, notifications.c.kind, notifications.c.run_id, notifications.c.created_at)
            .join(notifications, notifications.c.id == deliveries.c.notification_id)
            .order_by(deliveries.c.id.desc())
            .limit(limit)
        )
        if run_id is not None:
            query = query.where(notifications.c.run_id == run_id)

        async def work(conn: AsyncConnection) -> list[DeliveryRow]:
            return [
                DeliveryRow(
                    id=r.id,
                    target=r.target,
                    state=r.state,
                    attempts=int(r.attempts),
                    next_at=_moment(r.next_at),
                    last_error=r.last_error,
                    kind=r.kind,
                    run_id=r.run_id,
                    created_at=_moment(r.created_at),
                )
                for r in await conn.execute(query)
            ]

        result: list[DeliveryRow] = await self._read(work)
        return result


# -- written inside other transactions ----------------------------------------------------


async def notify(
    conn: AsyncConnection, dialect: str, items: list[NewNotification], targets: list[str], now: datetime
) -> None:
    """Write `items` (those not written before) with a delivery to each of `targets`."""
    if not items or not targets:
        return
    keys = [i.key for i in items]
    await conn.execute(
        statements.insert_ignore(dialect, notifications),
        [
            {"dedup_key": i.key, "kind": i.kind, "run_id": i.run_id, "payload": i.payload, "created_at": now}
            for i in items
        ],
    )
    ids = list((await conn.execute(select(notifications.c.id).where(notifications.c.dedup_key.in_(keys)))).scalars())
    await conn.execute(
        statements.insert_ignore(dialect, deliveries),
        [
            {
                "notification_id": nid,
                "target": target,
                "state": "pending",
                "attempts": 0,
                "next_at": now,
                "updated_at": now,
            }
            for nid in ids
            for target in targets
        ],
    )


async def known_targets(conn: AsyncConnection) -> list[str]:
    """The webhooks some process registered. With none, nothing is written: a database
    nobody is told about pays one small read per transaction that could tell."""
    return list((await conn.execute(select(webhook_targets.c.name))).scalars())


async def notify_runs(conn: AsyncConnection, dialect: str, started: list[int], ended: list[int], now: datetime) -> None:
    """Tell of the runs among `started` that are under way and of those among `ended` that
    ended, as the database has them in this transaction (a stale move changed nothing)."""
    ids = sorted(set(started) | set(ended))
    if not ids:
        return
    targets = await known_targets(conn)
    if not targets:
        return
    items: list[NewNotification] = []
    for run in await conn.execute(select(runs).where(runs.c.id.in_(ids))):
        payload = run_payload(run)
        if run.id in started and run.started_at is not None:
            items.append(NewNotification(f"run:{run.id}:started", "run.started", run.id, payload))
        if run.id in ended and run.status in ENDED:
            items.append(NewNotification(f"run:{run.id}:ended", f"run.{run.status}", run.id, payload))
    await notify(conn, dialect, items, targets, now)


async def notify_cleanup(
    conn: AsyncConnection, dialect: str, run_id: int, attempt: str, status: str, report: dict[str, Any], now: datetime
) -> None:
    """Tell how a run's cleanup ended; `attempt` (its claim's token) tells cleanups apart."""
    targets = await known_targets(conn)
    if not targets:
        return
    run = (await conn.execute(select(runs).where(runs.c.id == run_id))).one()
    payload = run_payload(run)
    payload["cleanup"] = status
    told = ("verdict", "reverted", "restored", "failed", "held", "over_cap")
    payload["report"] = {k: report[k] for k in told if k in report}
    payload["report"]["errors"] = list(report.get("errors", []))[:5]
    item = NewNotification(f"run:{run_id}:cleanup:{attempt}", f"cleanup.{status}", run_id, payload)
    await notify(conn, dialect, [item], targets, now)


def run_payload(run: Any) -> dict[str, Any]:
    return {
        "run": run.id,
        "event": run.event_id,
        "version": run.event_version,
        "title": run.title,
        "status": run.status,
        "error": run.error,
        "cleanup": run.cleanup_status,
        "created_by": run.created_by,
        "started_at": _iso(run.started_at),
        "ended_at": _iso(run.ended_at),
    }


def _iso(value: datetime | None) -> str | None:
    moment = aware(value)
    return moment.isoformat() if moment is not None else None


def _moment(value: Any) -> datetime:
    moment = aware(value)
    assert moment is not None, "a NOT NULL time column read back empty"
    return moment

"""Webhooks: tell operators that a run started, ended or failed, and how its cleanup went.

Each `[[webhooks]]` table of `roadie.toml` is one target. The store writes a notification
in the transaction that made it true, with a delivery to each target; every worker sends
the deliveries that are due, each under a claim of its own, and retries those that fail
with a growing pause. A delivery is sent at least once: the `webhook-id` header is the
same on every attempt, so a receiver can drop a repeat. With a `secret`, each request is
signed as Standard Webhooks says (`webhook-id`, `webhook-timestamp`, `webhook-signature`).

Formats: `json` (the Standard Webhooks payload: `type`, `timestamp`, `data`), `discord`
and `slack` (a line of text each of them shows as a message).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import typing
from datetime import datetime, timedelta
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from standardwebhooks import Webhook as Signer

from roadie.clock import Clock
from roadie.errors import ConfigError
from roadie.log import get_logger
from roadie.store import Store, mint_token
from roadie.store.notify import Delivery

log = get_logger(__name__)

# The pause before each retry; past the last, the delivery is given up (about four hours
# in all, so a receiver down for a maintenance window still gets it).
BACKOFF = (5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0, 7200.0)
RETRYABLE = {408, 409, 425, 429}
BATCH = 10

Kind = Literal[
    "run.started",
    "run.succeeded",
    "run.failed",
    "run.cancelled",
    "cleanup.complete",
    "cleanup.incomplete",
    "cleanup.rolled_back",
    "cleanup.held",
    "run.world",
]
KINDS: tuple[Kind, ...] = typing.get_args(Kind)


class Webhook(BaseModel):
    """One `[[webhooks]]` table of `roadie.toml`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    url: str = Field(pattern=r"^https?://\S+$")
    format: Literal["json", "discord", "slack"] = "json"
    secret: str | None = None  # a Standard Webhooks secret, `whsec_` and base64
    events: list[Kind] = Field(default_factory=lambda: list(KINDS))
    dashboard_url: str | None = None  # where `roadie serve` is reached, for a link to the run
    timeout: float = Field(default=10.0, gt=0, le=60)

    @field_validator("secret")
    @classmethod
    def _secret_signs(cls, value: str | None) -> str | None:
        # The reference library decodes leniently (it skips what is not base64), so a typo
        # would sign with some other key: the secret is checked strictly here.
        if value is None:
            return None
        try:
            key = base64.b64decode(value.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            key = b""
        if not value.startswith("whsec_") or not 24 <= len(key) <= 64:
            raise ValueError("must be a Standard Webhooks secret: 'whsec_' then 24 to 64 bytes in base64")
        return value


class Notifier:
    """Sends the deliveries that are due to this process's webhooks."""

    def __init__(
        self,
        store: Store,
        webhooks: list[Webhook],
        clock: Clock,
        *,
        incarnation: str,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.store = store
        self.webhooks = {w.name: w for w in webhooks}
        self.clock = clock
        self.incarnation = incarnation
        self._client = client
        self._registered = False

    async def register(self) -> None:
        """Make this process's webhooks known to the store (once), so that what happens
        from now on is sent to them."""
        if self.webhooks and not self._registered:
            await self.store.register_webhooks(self.webhooks, self.clock.now())
            self._registered = True

    async def deliver_due(self) -> int:
        """Send what is due now, a batch at a time; answer how many were delivered."""
        if not self.webhooks:
            return 0
        await self.register()
        # A webhook is held by one sender at a time and its deliveries go one after
        # another, oldest first, so a channel reads "started" before "failed" whichever
        # worker sends them; the webhooks side by side. The claim outlives them all.
        ttl = max(w.timeout for w in self.webhooks.values()) * (BATCH + 1)
        token = mint_token(self.incarnation)
        batch = await self.store.claim_deliveries(self.webhooks, token, self.clock.now(), ttl, BATCH)
        if not batch:
            return 0
        by_target: dict[str, list[Delivery]] = {}
        for delivery in batch:
            by_target.setdefault(delivery.target, []).append(delivery)
        try:
            return sum(await asyncio.gather(*(self._send_in_order(d) for d in by_target.values())))
        finally:
            await self.store.release_webhooks(token)

    async def _send_in_order(self, batch: list[Delivery]) -> int:
        return sum([await self._send(delivery) for delivery in batch])

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _send(self, delivery: Delivery) -> bool:
        hook = self.webhooks[delivery.target]
        now = self.clock.now
        if delivery.kind not in hook.events:
            await self.store.finish_delivery(delivery, "skipped", now())
            return False
        try:
            answer = await self.post(
                hook, f"roadie-{delivery.notification_id}", delivery.kind, delivery.payload, delivery.created_at
            )
        except (TimeoutError, httpx.HTTPError) as exc:
            error = f"no answer within {hook.timeout:g}s" if isinstance(exc, TimeoutError) else _describe(exc)
            return await self._retry(delivery, error, None)
        if answer.is_success:
            await self.store.finish_delivery(delivery, "delivered", now())
            return True
        error = f"HTTP {answer.status_code}: {answer.text[:300]}"
        if answer.status_code in RETRYABLE or answer.status_code >= 500:
            return await self._retry(delivery, error, _retry_after(answer))
        # Any other answer (a 4xx, a redirect) will be the same next time.
        log.warning("webhook refused", target=hook.name, kind=delivery.kind, error=error)
        await self.store.finish_delivery(delivery, "gave_up", now(), error=error)
        return False

    async def post(
        self, hook: Webhook, message_id: str, kind: str, payload: dict[str, Any], created_at: datetime
    ) -> httpx.Response:
        """Send one message to `hook`, signed if it has a secret, within its timeout.
        Raises `TimeoutError` or `httpx.HTTPError` when no answer came."""
        body = json.dumps(render(hook, kind, payload, created_at), separators=(",", ":"), ensure_ascii=False)
        sent_at = self.clock.now()
        headers = {
            "content-type": "application/json",
            "user-agent": "roadie-webhooks",
            "webhook-id": message_id,
            "webhook-timestamp": str(int(sent_at.timestamp())),
        }
        if hook.secret:
            headers["webhook-signature"] = Signer(hook.secret).sign(message_id, sent_at, body)
        async with self.clock.timeout(hook.timeout):
            return await self._http().post(hook.url, content=body.encode(), headers=headers)

    async def send_test(self, name: str) -> httpx.Response:
        """Send `name` a message that says it can be reached (`roadie webhooks test`)."""
        now = self.clock.now()
        return await self.post(self.webhooks[name], f"roadie-test-{int(now.timestamp())}", "test", {}, now)

    async def _retry(self, delivery: Delivery, error: str, after: float | None) -> bool:
        attempt = delivery.attempts  # 0 for the first
        now = self.clock.now()
        if attempt >= len(BACKOFF):
            log.warning("webhook given up", target=delivery.target, kind=delivery.kind, error=error)
            await self.store.finish_delivery(delivery, "gave_up", now, error=error)
            return False
        pause = max(BACKOFF[attempt], min(after or 0.0, 3600.0))
        log.info("webhook failed; will retry", target=delivery.target, kind=delivery.kind, error=error, pause=pause)
        await self.store.finish_delivery(delivery, "pending", now, next_at=now + timedelta(seconds=pause), error=error)
        return False

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client


def render(hook: Webhook, kind: str, payload: dict[str, Any], created_at: datetime) -> dict[str, Any]:
    """The body `hook` is sent for a notification, in its format."""
    if hook.format == "json":
        return {"type": kind, "timestamp": created_at.isoformat(), "data": payload}
    text = describe(kind, payload, hook.dashboard_url)
    if hook.format == "discord":
        # Names and errors come from event files and game servers: they ping no one.
        return {"content": text[:2000], "allowed_mentions": {"parse": []}}
    return {"text": _slack_escape(text)}


def describe(kind: str, data: dict[str, Any], dashboard_url: str | None = None) -> str:
    """One line a person reads in a chat channel."""
    if kind == "test":
        return "🔔 Roadie can reach this channel (a test sent by `roadie webhooks test`)."
    run = f"Run {data.get('run')} · {data.get('title') or data.get('event')}"
    report = data.get("report") or {}
    lines = {
        "run.started": f"▶ {run} started.",
        "run.succeeded": f"✅ {run} succeeded.",
        "run.failed": f"❌ {run} failed: {data.get('error') or 'a step failed'}.",
        "run.cancelled": f"⏹ {run} was cancelled.",
        "cleanup.complete": (
            f"🧹 {run} is cleaned up: {report.get('reverted', 0)} reverted, {report.get('restored', 0)} restored"
            + (", verified clean." if report.get("verdict") == "verified_clean" else ".")
        ),
        "cleanup.held": (
            f"✋ {run}: cleanup is held, more to revert than a module's cap allows. "
            f"`roadie cleanup {data.get('run')} --plan` shows it; `--confirm` runs it."
        ),
        "cleanup.rolled_back": (
            f"↺ {run}: the world was found partially rolled back; what came back was reverted again, "
            "and the next cleanup round checks it."
        ),
        "run.world": _world_line(run, data),
        "cleanup.incomplete": (
            f"⚠ {run}: cleanup is incomplete, {report.get('failed', 0)} left in the world. "
            f"`roadie cleanup {data.get('run')} --again` tries again."
        ),
    }
    line = lines.get(kind, f"{run}: {kind}.")
    if dashboard_url:
        line += f" {dashboard_url.rstrip('/')}/runs/{data.get('run')}"
    return line


def _world_line(run: str, data: dict[str, Any]) -> str:
    """What happened to a running run's setup in the world, as a chat line."""
    what = data.get("world")
    if what == "reapplied":
        found, value = data.get("found"), data.get("value")
        return f"↻ {run}: {data.get('ref')} showed {found!r} again (a restart?); set back to {value!r}."
    if what == "left_alone":
        return f"✋ {run}: {data.get('ref')} was set to {data.get('found')!r} by someone else; left alone."
    lost = ", ".join(f"{n} {kind}" for kind, n in (data.get("lost") or {}).items())
    step, module = data.get("step"), data.get("module")
    return f"⚠ {run}: the world lost {lost} made by step {step!r} (a restart of {module}); it cannot be put back."


def _slack_escape(text: str) -> str:
    # Slack reads &, < and > as markup (links, mentions); the rest is shown as written.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _retry_after(answer: httpx.Response) -> float | None:
    value = answer.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _describe(exc: httpx.HTTPError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def parse_webhooks(tables: Any, source: str) -> list[Webhook]:
    """The `[[webhooks]]` of a configuration file, each checked; a bad one names its field."""
    if not isinstance(tables, list):
        raise ConfigError(f"{source}: webhooks must be [[webhooks]] tables")
    hooks: list[Webhook] = []
    for index, table in enumerate(tables):
        try:
            hooks.append(Webhook.model_validate(table))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "table"
            raise ConfigError(f"{source}: webhooks[{index}].{field}: {first['msg']}") from exc
    names = [h.name for h in hooks]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: two webhooks share a name")
    return hooks

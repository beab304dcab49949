"""Pull mode: the module polls the engine's gateway for work and posts its answers back
(DESIGN §6, "Two transports"), for a game server behind a firewall that can only make
outgoing requests.

Each pulled call is handled by the same `ModuleServer.handle` as a pushed one (same key
ledger, same statuses); the status and body a push server would have sent are what is
posted back. Delivery is at-least-once: a call whose answer never arrived is handed out
again after its visibility timeout, and the key ledger answers it without acting twice.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from roadie import protocol
from roadie.clock import Clock
from roadie.errors import RetryableError, RoadieError
from roadie.log import get_logger
from roadie.plugin.server import Faults, ModuleServer, Reply, View
from roadie.registry.module import Module

log = get_logger(__name__)


class PullClient:
    """Serves `module` by polling the gateway at `engine_url`.

    `run()` announces the module's manifest once, then long-polls for up to `max_calls`
    calls at a time (holding each poll open `wait` seconds), handles them concurrently,
    and posts each answer. Calls of one key, or of one lease target, are never run at
    once: each waits for the one before it in queue order (a restore must not overtake
    the apply it gives back, nor a revert the dispatch it undoes). Connection failures
    and 5xx back off exponentially from `backoff` to `max_backoff` seconds, with jitter.
    `stop()` ends the poll; calls already taken are finished and answered before `run()`
    returns.
    """

    def __init__(
        self,
        module: Module,
        engine_url: str,
        secret: protocol.Secrets,
        ledger_path: str,
        *,
        settings: Mapping[str, Any] | None = None,
        base_dir: str = ".",
        clock: Clock | None = None,
        faults: Faults | None = None,
        views: Mapping[str, View] | None = None,
        max_calls: int = 16,
        wait: float = 20.0,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.server = ModuleServer(
            module,
            secret=secret,
            ledger_path=ledger_path,
            settings=settings,
            base_dir=base_dir,
            clock=clock,
            faults=faults,
            engine_url=self.engine_url,
            views=views,
            http=http,
        )
        self.module = module
        self.max_calls = max_calls
        self.wait = wait
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.handled = 0  # calls handled (answered or dropped on purpose)
        self._stopping = False
        self._poll: asyncio.Task[Any] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lanes: dict[str, asyncio.Task[None]] = {}  # the last call taken per key or lease target
        self._announced: asyncio.Event | None = None
        self._random = random.Random()

    def __repr__(self) -> str:
        return f"<PullClient {self.module.name} engine={self.engine_url!r}>"

    @property
    def announced(self) -> asyncio.Event:
        """Set once the gateway accepted the manifest."""
        if self._announced is None:
            self._announced = asyncio.Event()
        return self._announced

    def stop(self) -> None:
        """Stop polling; `run()` returns once the calls already taken are answered."""
        self._stopping = True
        if self._poll is not None and not self._poll.done():
            self._poll.cancel()

    async def run(self) -> None:
        """Announce, then pull and answer until `stop()`. Raises RoadieError when the gateway
        refuses the announcement for good (a wrong secret, a module it does not know)."""
        await self.server.open()
        try:
            await self._announce()
            failures = 0
            while not self._stopping:
                try:
                    calls = await self._pull()
                except asyncio.CancelledError:
                    if self._stopping:
                        break
                    raise
                except RetryableError as exc:
                    failures += 1
                    delay = self._delay(failures)
                    log.warning("pull failed", module=self.module.name, error=exc.message, retry_in=round(delay, 2))
                    await self._sleep(delay)
                    continue
                failures = 0
                for call in calls:
                    self._start(call)
                # Take no more than we can hold: wait while `max_calls` are in hand.
                while len(self._tasks) >= self.max_calls and not self._stopping:
                    await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            await self.server.close()

    def _start(self, call: protocol.PulledCall) -> None:
        """Run `call` once the call before it in its lane has ended."""
        lane = _lane(call)
        before = self._lanes.get(lane)
        task = asyncio.create_task(self._handle_after(before, call))
        self._lanes[lane] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def leave(done: asyncio.Task[None]) -> None:
            if self._lanes.get(lane) is done:
                del self._lanes[lane]

        task.add_done_callback(leave)

    async def _handle_after(self, before: asyncio.Task[None] | None, call: protocol.PulledCall) -> None:
        if before is not None:
            # Its outcome is its own (it answers for itself); only its end matters here.
            await asyncio.wait({before})
        await self._handle(call)

    async def _announce(self) -> None:
        body = self.server.manifest().model_dump(mode="json")
        failures = 0
        while not self._stopping:
            try:
                status, answer = await self.server.post(self.engine_url, protocol.ANNOUNCE, body)
            except RetryableError as exc:
                status, answer = 0, exc.message
            if 200 <= status < 300:
                log.info("announced", module=self.module.name, engine=self.engine_url)
                self.announced.set()
                return
            if status and not protocol.retryable_status(status):
                raise RoadieError(f"{self.module.name}: the gateway refused the announcement: HTTP {status}: {answer}")
            failures += 1
            delay = self._delay(failures)
            log.warning("announce failed", module=self.module.name, status=status, retry_in=round(delay, 2))
            await self._sleep(delay)

    async def _pull(self) -> list[protocol.PulledCall]:
        body = protocol.PullRequest(max=self.max_calls - len(self._tasks), wait=self.wait).model_dump(mode="json")
        self._poll = asyncio.create_task(
            self.server.post(
                self.engine_url,
                protocol.PULL,
                body,
                read_timeout=self.wait + 15.0,
                signed_answer=True,
                extra_headers={protocol.H_FEATURES: protocol.FEATURE_TOKENS},
            )
        )
        try:
            status, answer = await self._poll
        finally:
            self._poll = None
        if not 200 <= status < 300:
            raise RetryableError(f"pull answered HTTP {status}: {str(answer)[:200]}")
        try:
            return protocol.PullAnswer.model_validate(answer).calls
        except ValidationError as exc:
            raise RetryableError(f"pull answered something that is not a PullAnswer: {exc}") from exc

    async def _handle(self, call: protocol.PulledCall) -> None:
        raw = json.dumps(call.body, separators=(",", ":")).encode()
        reply = await self.server.handle(call.kind, raw)
        self.handled += 1
        if reply.lost:
            log.info("answer not posted on purpose", module=self.module.name, call=call.id)
            return
        await self._answer(call, reply)

    async def _answer(self, call: protocol.PulledCall, reply: Reply) -> None:
        # The delivery's token, when the gateway gave one: the answer is kept only for the
        # delivery in hand, and a gateway that gave none would not know the field.
        answer_post = protocol.AnswerPost(id=call.id, status=reply.status, body=reply.body, token=call.token)
        body = answer_post.model_dump(mode="json", exclude={"token"} if call.token is None else None)
        for attempt in range(1, 9):
            try:
                status, answer = await self.server.post(
                    self.engine_url, protocol.ANSWER, body, key=call.idempotency_key
                )
            except RetryableError as exc:
                status, answer = 0, exc.message
            if 200 <= status < 300:
                if isinstance(answer, dict) and answer.get("accepted") is False:
                    log.info("answer not taken", module=self.module.name, call=call.id, reason=answer.get("reason"))
                return
            if status and not protocol.retryable_status(status):
                # The gateway will not take it (the call expired, was answered already...):
                # it hands the call out again if it still wants it.
                log.warning("answer refused", module=self.module.name, call=call.id, status=status, body=answer)
                return
            if self._stopping and attempt >= 3:
                break
            await self._sleep(self._delay(attempt))
        log.warning("answer not delivered; the gateway will hand the call out again", call=call.id)

    def _delay(self, failures: int) -> float:
        base = min(self.max_backoff, self.backoff * 2.0 ** (failures - 1))
        return base * (0.5 + self._random.random() / 2)

    async def _sleep(self, seconds: float) -> None:
        """Back off on the server's clock; `stop()` cuts the wait short."""
        if self._stopping:
            return
        self._poll = asyncio.create_task(self.server.clock.sleep(seconds))
        try:
            await self._poll
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        finally:
            self._poll = None


def _lane(call: protocol.PulledCall) -> str:
    """What must not run twice at once: a lease call's target (its apply, restore and
    reads carry different keys), else the call's key."""
    if call.kind.startswith("lease."):
        lease, target = call.body.get("lease"), call.body.get("target")
        return f"lease:{lease}#{target}" if target is not None else f"lease:{lease}"
    return f"key:{call.idempotency_key}"

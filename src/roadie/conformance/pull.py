"""Pull mode: the kit serves a work queue (the engine's own gateway, over a throwaway
SQLite store) and checks the module that polls it, through the same rules as push.

The module is started by the operator, pointed at the URL the kit listens on, with the
same secret. Its announce is the manifest the rules read; every other call is put on the
queue exactly as the engine would, and the status and body the module posts back are the
answer. Rules that need raw bytes on the wire (the signature and invalid-JSON checks) do
not apply to a module that never receives requests: the gateway refuses any request of
the module's that is not signed with its secret, so a module that got as far as
announcing signs correctly.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response

from roadie import protocol
from roadie.conformance.session import ConformanceOptions
from roadie.conformance.transport import Kind, TransportFailed, key_of
from roadie.registry import Registry
from roadie.remote.gateway import Gateway, Server
from roadie.remote.queue import WorkQueue
from roadie.store.store import Store


class _EveryName(dict[str, str]):
    """One secret for whatever module calls: the kit learns the module's name only from
    its announce, and checks one module at a time."""

    def __init__(self, secret: protocol.Secrets) -> None:
        super().__init__()
        self.secret = secret

    def get(self, key: str, default: Any = None) -> Any:
        return self.secret

    def __getitem__(self, key: str) -> Any:
        return self.secret


class _ForgingGateway(Gateway):
    """The engine's gateway, which can answer the module's next polls with forged work: a
    call in an answer that is unsigned, signed with another secret, or signed for another
    request (a replay). A module must carry out none of it (protocol.md §5): `answered`
    says whether it posted an answer for one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forgeries: list[tuple[str, protocol.PulledCall]] = []
        self.polls = 0
        self.polled = asyncio.Event()
        self.answered: set[int] = set()

    async def pull(self, request: Request) -> Any:
        self.polls += 1
        self.polled.set()
        if not self.forgeries:
            return await super().pull(request)
        module, _, request_id = await self._verified(request)
        how, call = self.forgeries.pop(0)
        answer = protocol.PullAnswer(calls=[call])
        # Replayed: signed with the module's own secret, for a request it sent long ago.
        signing = self.secrets[module] if how == "replayed" else "not-the-secret-" + protocol.new_id()
        answering = protocol.new_id() if how == "replayed" else request_id
        if protocol.FEATURE_SIGNED_BODY in protocol.features(request.headers):
            raw = protocol.signed_body(signing, answering, protocol.PULL, answer.model_dump(mode="json"))
            if how == "unsigned":
                raw = answer.model_dump_json().encode()  # the calls, with no envelope at all
            return Response(raw, media_type="application/json")
        raw = answer.model_dump_json().encode()
        headers = {} if how == "unsigned" else protocol.sign_answer(signing, answering, protocol.PULL, raw)
        return Response(raw, media_type="application/json", headers=headers)

    async def answer(self, request: Request) -> Any:
        try:
            posted = protocol.AnswerPost.model_validate_json(await request.body())
            self.answered.add(posted.id)
        except ValueError:
            pass  # the gateway says why
        return await super().answer(request)


class QueueTransport:
    """Calls put on the work queue for the announced module; answers as it posts them."""

    mode = "pull"

    def __init__(self, queue: WorkQueue, options: ConformanceOptions) -> None:
        self.queue = queue
        self.options = options
        self.manifest: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.gateway: _ForgingGateway | None = None
        self.gave_up = ""  # why no module is awaited any more

    async def forged_polls(self, calls: list[tuple[str, protocol.PulledCall]]) -> list[int]:
        """Answer the module's next polls with `calls` (how each is forged, and the call),
        wait for the poll after the last (a module polls again, after a backoff, once it has
        refused one, or carried it out), and give the ids of the forged calls it posted an
        answer for."""
        gateway = self.gateway
        assert gateway is not None
        gateway.forgeries.extend(calls)
        deadline = asyncio.get_running_loop().time() + self.options.timeout + 60  # its backoff
        while gateway.forgeries or not gateway.polled.is_set():
            gateway.polled.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TransportFailed("the module did not poll again after a forged answer")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gateway.polled.wait(), remaining)
        return sorted(gateway.answered & {call.id for _, call in calls})

    def announced(self, manifest: protocol.Manifest) -> None:
        if self.options.module is not None and manifest.module != self.options.module:
            raise ValueError(f"this kit is checking {self.options.module!r}, not {manifest.module!r}")
        if not self.manifest.done():
            self.manifest.set_result(manifest.model_dump(mode="json"))

    async def _module(self) -> dict[str, Any]:
        """The module's manifest, once it has announced itself. It is waited for once, up
        to `announce_timeout`: every call after that fails at once, not by waiting as long
        again (a check's retries had a run with no module last 141 s)."""
        if self.gave_up:
            raise TransportFailed(self.gave_up)
        try:
            return await asyncio.wait_for(asyncio.shield(self.manifest), self.options.announce_timeout)
        except TimeoutError:
            self.gave_up = f"no module announced itself within {self.options.announce_timeout:g}s"
            raise TransportFailed(self.gave_up) from None

    async def call(self, kind: Kind, body: Any, *, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        manifest = await self._module()
        if kind == "manifest":
            return 200, manifest
        try:
            return await asyncio.wait_for(
                self.queue.submit(str(manifest["module"]), kind, key_of(body), dict(body)), self.options.timeout
            )
        except TimeoutError:
            raise TransportFailed(
                f"the module did not answer a pulled {kind} within {self.options.timeout:.0f}s"
            ) from None

    async def aclose(self) -> None:
        return None


@asynccontextmanager
async def serve_queue(url: str, secret: str, options: ConformanceOptions) -> AsyncIterator[QueueTransport]:
    """Listen at `url` (host and port) with the engine's gateway over a fresh work queue."""
    import uvicorn

    where = urlsplit(url if "://" in url else f"http://{url}")
    host, port = where.hostname or "127.0.0.1", where.port or 7400
    with tempfile.TemporaryDirectory(prefix="roadie-conformance-") as home:
        store = await Store.open(f"sqlite:///{Path(home) / 'queue.db'}")
        try:
            queue = WorkQueue(store, visibility=max(5.0, options.timeout))
            transport = QueueTransport(queue, options)
            secrets = {options.module: secret} if options.module else _EveryName(secret)
            gateway = _ForgingGateway(store, queue, secrets, Registry(), on_announce=transport.announced)
            transport.gateway = gateway
            config = uvicorn.Config(
                gateway.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=1
            )
            server = Server(config, lambda: queue)
            serving = asyncio.create_task(server.serve())
            while not server.started:
                if serving.done():
                    # uvicorn logs why, and exits, when it cannot bind.
                    with contextlib.suppress(SystemExit):
                        await serving
                    raise TransportFailed(f"cannot listen on {host}:{port}")
                await asyncio.sleep(0.02)
            try:
                yield transport
            finally:
                server.should_exit = True
                await serving
        finally:
            await store.close()

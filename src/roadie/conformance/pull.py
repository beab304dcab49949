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

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def get(self, key: str, default: Any = None) -> Any:
        return self.secret

    def __getitem__(self, key: str) -> str:
        return self.secret


class QueueTransport:
    """Calls put on the work queue for the announced module; answers as it posts them."""

    mode = "pull"

    def __init__(self, queue: WorkQueue, options: ConformanceOptions) -> None:
        self.queue = queue
        self.options = options
        self.manifest: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    def announced(self, manifest: protocol.Manifest) -> None:
        if self.options.module is not None and manifest.module != self.options.module:
            raise ValueError(f"this kit is checking {self.options.module!r}, not {manifest.module!r}")
        if not self.manifest.done():
            self.manifest.set_result(manifest.model_dump(mode="json"))

    async def _module(self) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(asyncio.shield(self.manifest), self.options.announce_timeout)
        except TimeoutError:
            raise TransportFailed(f"no module announced itself within {self.options.announce_timeout:.0f}s") from None

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
            gateway = Gateway(store, queue, secrets, Registry(), on_announce=transport.announced)
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

"""roadie/v1 is retired: a module written for it is told, in one line, what to change
(docs/protocol.md, "From roadie/v1"), rather than left with a bare 401 or 404."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from roadie import protocol
from roadie.registry import Registry
from roadie.remote.gateway import Gateway
from roadie.remote.queue import WorkQueue
from roadie.store.store import Store

SECRET = "retired-secret"
V1_MANIFEST = {"protocol": "roadie/v1", "module": "sandbox", "actions": [], "leases": []}


def test_the_gateway_answers_410_with_one_line_on_every_v1_path_and_refuses_a_v1_announce(tmp_path: Path) -> None:
    async def go() -> None:
        store = await Store.open(f"sqlite:///{tmp_path / 'roadie.db'}")
        try:
            gateway = Gateway(store, WorkQueue(store), {"sandbox": SECRET}, Registry())
            transport = httpx.ASGITransport(app=gateway.app())
            async with httpx.AsyncClient(transport=transport, base_url="http://engine.test") as client:
                for name in ("announce", "pull", "answer", "report"):
                    path = f"/roadie/v1/{name}"
                    raw = json.dumps(V1_MANIFEST if name == "announce" else {}).encode()
                    # Signed as a v1 module signed (the body alone), or not at all: either way.
                    headers = protocol.sign(SECRET, "POST", path, raw, module="sandbox")
                    response = await client.post(path, content=raw, headers=headers)
                    assert response.status_code == 410, (path, response.text)
                    assert response.json() == {"error": {"message": protocol.V1_RETIRED, "retryable": False}}
                    assert "\n" not in protocol.V1_RETIRED
                unsigned = await client.get("/roadie/v1/manifest")
                assert (unsigned.status_code, unsigned.json()["error"]["message"]) == (410, protocol.V1_RETIRED)

                # A v1 manifest announced on the v2 path is refused, saying the same line.
                raw = json.dumps(V1_MANIFEST).encode()
                headers = protocol.sign(SECRET, "POST", protocol.ANNOUNCE, raw, module="sandbox")
                refused = await client.post(protocol.ANNOUNCE, content=raw, headers=headers)
                assert 400 <= refused.status_code < 500
                assert protocol.V1_RETIRED in refused.json()["error"]["message"]
        finally:
            await store.close()

    asyncio.run(go())

"""The web app under test: `Site` starts `create_app` in a Starlette TestClient on a
fresh database of this test's backend, with one token per role minted beforehand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from roadie.store import Store
from roadie.store.rows import RunRow
from roadie.web import WebOptions, create_app, tokens
from roadie.web.state import WebState
from tests.databases import Database

ROLES = ("viewer", "operator", "admin")

QUICK = """\
id: quick-raid
title: A quick raid
params:
  region: {type: str, default: yew}
  count: {type: int, default: 2, min: 1}
cleanup: manual
phases:
  - name: omen
    steps:
      - action: core.lease
        name: fog
        with: {lease: sandbox.weather, target: "{{ region }}", value: fog}
      - action: sandbox.broadcast
        with: {message: "Raiders near {{ region }}"}
  - name: raid
    steps:
      - action: sandbox.spawn
        name: raiders
        with: {kind: raider, region: "{{ region }}", count: "{{ count }}"}
"""

# Its second phase waits an hour: a run of it stays in flight for as long as a test needs.
SLOW = QUICK.replace("id: quick-raid", "id: slow-raid").replace("  - name: raid\n", "  - name: raid\n    after: 1h\n")


def mint_tokens(url: str, *names: str, role: str | None = None) -> dict[str, str]:
    """A token per role (named after it, or all of `role`), minted into the store as the CLI does."""

    async def go() -> dict[str, str]:
        store = await Store.open(url)
        try:
            made = {}
            for name in names:
                m = tokens.mint()
                await store.create_token(
                    key=m.key, name=name, role=role or name, secret_hash=m.secret_hash, actor="test", now=_now()
                )
                made[name] = m.token
            return made
        finally:
            await store.close()

    return asyncio.run(go())


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


@dataclass
class Site:
    client: TestClient
    url: str
    tokens: dict[str, str]
    home: Path
    made: list[str] = field(default_factory=list)

    @property
    def state(self) -> WebState:
        state: WebState = self.client.app.state.web  # type: ignore[attr-defined]
        return state

    def auth(self, role: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}

    def get(self, path: str, role: str | None = "viewer", **kw: Any) -> Any:
        return self.client.get(path, headers=self.auth(role), **kw)

    def post(self, path: str, role: str | None = "admin", **kw: Any) -> Any:
        return self.client.post(path, headers={**self.auth(role), **kw.pop("headers", {})}, **kw)

    def upload(self, text: str, role: str = "admin") -> Any:
        return self.post("/api/v1/events", role, content=text.encode(), headers={"content-type": "text/plain"})

    def store_call(self, fn: Callable[[Store], Any]) -> Any:
        """Run `fn(store)` in the app's event loop, as the app would."""
        portal = self.client.portal  # type: ignore[attr-defined]
        return portal.call(fn, self.state.store)

    def run_row(self, run_id: int) -> RunRow:
        return self.store_call(lambda s: s.get_run(run_id))  # type: ignore[no-any-return]

    def wait_settled(self, run_id: int, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.get(f"/api/v1/runs/{run_id}").json()
            ended = run["status"] in ("succeeded", "failed", "cancelled")
            if ended and not (run["cleanup_policy"] == "auto" and run["cleanup_status"] == "pending"):
                return run  # type: ignore[no-any-return]
            time.sleep(0.05)
        raise AssertionError(f"run {run_id} did not settle in {timeout}s")


@pytest.fixture
def make_site(tmp_path: Path, database: Database) -> Iterator[Callable[..., Site]]:
    """`make_site(worker=True)`: a running app on a fresh database with the sandbox world."""
    clients: list[TestClient] = []

    def make(*, worker: bool = True) -> Site:
        home = tmp_path / f"site{len(clients)}"
        home.mkdir()
        (home / "roadie.toml").write_text(
            f'[engine]\npoll_interval = 0.05\n\n[modules.sandbox]\ndb = "{home / "world.db"}"\n'
        )
        url = database.fresh(home)
        made = mint_tokens(url, *ROLES)
        app = create_app(WebOptions(database_url=url, config=str(home / "roadie.toml"), worker=worker, poll=0.1))
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return Site(client, url, made, home)

    yield make
    for client in clients:
        client.__exit__(None, None, None)
    database.drop_all()


@pytest.fixture
def site(make_site: Callable[..., Site]) -> Site:
    return make_site()

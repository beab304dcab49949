"""The databases the suite runs on (the `database` fixture in conftest.py uses these).

`ROADIE_TEST_DATABASES` picks the backends (default: all three). Every test that uses
the `database` fixture (through `harness`) runs once per backend, each on a database of
its own. A server that cannot be reached skips its tests on a developer's machine and
fails them in CI (`CI=true`), where a skip would hide a missing service.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from roadie.store.dialects import async_url

SERVERS = {
    "postgresql": os.environ.get("ROADIE_TEST_POSTGRESQL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("ROADIE_TEST_MARIADB", "mysql://root@127.0.0.1:3306/test"),
}
BACKENDS = [b.strip() for b in os.environ.get("ROADIE_TEST_DATABASES", "sqlite,postgresql,mariadb").split(",") if b]
_reachable: dict[str, str | None] = {}


async def _admin(url: str, *statements: str) -> None:
    engine = create_async_engine(async_url(url), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()


def check_reachable(backend: str) -> str | None:
    """None when the backend's server answers (or needs none), else why not."""
    if backend == "sqlite":
        return None
    if backend not in SERVERS:
        return f"unknown test database {backend!r} (known: sqlite, {', '.join(SERVERS)})"
    if backend not in _reachable:
        try:
            asyncio.run(asyncio.wait_for(_admin(SERVERS[backend], "SELECT 1"), 10))
            _reachable[backend] = None
        except Exception as exc:
            _reachable[backend] = f"{backend} at {SERVERS[backend]} is unreachable: {exc}"
    return _reachable[backend]


@dataclass
class Database:
    """One backend for one test: `fresh()` makes an empty database and answers its URL."""

    backend: str
    made: list[str] = field(default_factory=list)

    def fresh(self, home: Path) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{home / 'roadie.db'}"
        name = f"roadie_{secrets.token_hex(6)}"
        server = SERVERS[self.backend]
        asyncio.run(_admin(server, f"CREATE DATABASE {name}"))
        self.made.append(name)
        return make_url(server).set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        for name in self.made:
            asyncio.run(_admin(SERVERS[self.backend], f"DROP DATABASE IF EXISTS {name}"))
        self.made.clear()

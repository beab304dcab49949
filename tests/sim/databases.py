"""One empty, migrated database per seed, cheaply.

SQLite: the schema is migrated once into a template file, which each seed copies.
PostgreSQL and MariaDB: one database is made and migrated per process; between seeds
every table is emptied and its ids start again from 1, so a seed sees the same ids on
every replay.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from pathlib import Path

from sqlalchemy.engine import make_url

from roadie.store import Store, tables
from tests.databases import SERVERS, _admin, check_reachable


class SeedDatabases:
    """Hands out an empty database for each seed; `close()` drops what it made."""

    def __init__(self, backend: str, home: Path) -> None:
        self.backend = backend
        self.home = home
        self.made: str | None = None
        problem = check_reachable(backend)
        if problem is not None:
            raise RuntimeError(problem)
        if backend == "sqlite":
            self.template = home / "template.db"
            self.url = f"sqlite:///{home / 'seed.db'}"
            asyncio.run(self._migrate(f"sqlite:///{self.template}"))
        else:
            # A name of its own: two runs of the simulation on one server never meet.
            self.made = f"roadie_sim_{os.getpid()}_{secrets.token_hex(3)}"
            server = SERVERS[backend]
            asyncio.run(_admin(server, f"CREATE DATABASE {self.made}"))
            self.url = make_url(server).set(database=self.made).render_as_string(hide_password=False)
            asyncio.run(self._migrate(self.url))

    @staticmethod
    async def _migrate(url: str) -> None:
        store = await Store.open(url)
        await store.close()

    async def fresh(self) -> str:
        """An empty database, ids from 1, at the URL answered."""
        if self.backend == "sqlite":
            self._copy_template()
            return self.url
        names = [t.name for t in tables.metadata.sorted_tables]
        if self.backend == "postgresql":
            await _admin(self.url, f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE")
        else:
            await _admin(
                self.url,
                "SET FOREIGN_KEY_CHECKS = 0",
                *(f"TRUNCATE TABLE {n}" for n in names),
                "SET FOREIGN_KEY_CHECKS = 1",
            )
        return self.url

    def _copy_template(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.home / 'seed.db'}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(self.template, self.home / "seed.db")

    def close(self) -> None:
        if self.made is not None:
            asyncio.run(_admin(SERVERS[self.backend], f"DROP DATABASE IF EXISTS {self.made}"))
            self.made = None

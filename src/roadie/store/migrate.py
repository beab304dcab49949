"""Apply the schema migrations (`roadie init`, and every engine start)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

from roadie.store import dialects

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection) -> None:
    """Bring the database on `connection` to the newest schema. Idempotent, and safe for
    many processes at once: they take turns under a database lock, and each after the
    first finds nothing left to do."""
    release = dialects.lock_for_migration(connection)
    try:
        command.upgrade(alembic_config(connection), "head")
    except BaseException:
        # A connection the server dropped took its session's lock with it; giving the lock
        # back on it would fail, and hide the drop that the caller makes a new one for.
        if not connection.invalidated:
            release()
        raise
    release()

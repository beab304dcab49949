"""Alembic's entry point. Roadie runs migrations itself (`roadie init`, and on start)."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from roadie.store.tables import metadata

config = context.config


def _options(connection: Connection) -> dict[str, Any]:
    # MariaDB's primary keys are always called PRIMARY and it warns about any other name,
    # which the metadata's naming convention and Alembic's own version table would give.
    # Migrations name what they create themselves; the metadata only autogenerates them.
    if connection.dialect.name in ("mysql", "mariadb"):
        return {"target_metadata": None, "version_table_pk": False}
    return {"target_metadata": metadata}


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, render_as_batch=True, **_options(connection))
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        context.configure(connection=conn, render_as_batch=True, **_options(conn))
        with context.begin_transaction():
            context.run_migrations()


run_migrations()

"""seen requests: the ids of signed requests a gateway accepted, kept for the signing window

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLE_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}


def _pk(table: str) -> str | None:
    # MariaDB names every primary key PRIMARY, whatever it is asked for.
    return None if op.get_bind().dialect.name in ("mysql", "mariadb") else op.f(f"pk_{table}")


def upgrade() -> None:
    op.create_table(
        "seen_requests",
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("expires_at", PRECISE_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("module", "request_id", name=_pk("seen_requests")),
        **TABLE_OPTIONS,
    )
    op.create_index("ix_seen_requests_expires_at", "seen_requests", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_seen_requests_expires_at", table_name="seen_requests")
    op.drop_table("seen_requests")

"""lease stacks: several runs borrow one setting at once, each a layer with a priority

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TABLE_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}


def _pk(table: str) -> str | None:
    # MariaDB names every primary key PRIMARY, whatever it is asked for.
    return None if op.get_bind().dialect.name in ("mysql", "mariadb") else op.f(f"pk_{table}")


def upgrade() -> None:
    op.create_table(
        "lease_stacks",
        sa.Column("ref", sa.String(length=190), nullable=False),
        sa.Column("base", sa.JSON(), nullable=True),
        sa.Column("shown", sa.JSON(), nullable=True),
        sa.Column("writing", sa.JSON(), nullable=True),
        sa.Column("claim_token", sa.String(length=64), nullable=True),
        sa.Column("claim_expires", PRECISE_DATETIME, nullable=True),
        sa.Column("updated_at", PRECISE_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("ref", name=_pk("lease_stacks")),
        **TABLE_OPTIONS,
    )


def downgrade() -> None:
    op.drop_table("lease_stacks")

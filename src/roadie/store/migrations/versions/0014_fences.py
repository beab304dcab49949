"""fences: a number that only grows, minted with each claim to change the world

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLE_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}


def _pk(table: str) -> str | None:
    # MariaDB names every primary key PRIMARY, whatever it is asked for.
    return None if op.get_bind().dialect.name in ("mysql", "mariadb") else op.f(f"pk_{table}")


def upgrade() -> None:
    counter = op.create_table(
        "fence_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=_pk("fence_counter")),
        **TABLE_OPTIONS,
    )
    op.bulk_insert(counter, [{"id": 1, "value": 0}])
    if op.get_bind().dialect.name != "sqlite":
        op.execute(sa.schema.CreateSequence(sa.Sequence("roadie_fence")))


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.execute(sa.schema.DropSequence(sa.Sequence("roadie_fence")))
    op.drop_table("fence_counter")

"""workers: who is alive, since when, and when each last said so

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _mysql() -> bool:
    # MariaDB's primary key is always called PRIMARY, and it warns about any other name.
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", PRECISE_DATETIME, nullable=False),
        sa.Column("heartbeat_at", PRECISE_DATETIME, nullable=False),
        sa.Column("stopped_at", PRECISE_DATETIME, nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=None if _mysql() else op.f("pk_workers")),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workers_heartbeat_at"), ["heartbeat_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workers_heartbeat_at"))
    op.drop_table("workers")

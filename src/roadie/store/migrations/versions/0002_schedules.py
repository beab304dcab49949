"""schedules: the exactly-once key of a scheduled run, and where each schedule stands

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _mysql() -> bool:
    # MariaDB's primary key is always called PRIMARY, and it warns about any other name.
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("schedule_key", sa.String(length=190), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_runs_schedule_key"), ["schedule_key"])

    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("last_occurrence", PRECISE_DATETIME, nullable=False),
        sa.Column("created_at", PRECISE_DATETIME, nullable=False),
        sa.Column("updated_at", PRECISE_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=None if _mysql() else op.f("pk_schedules")),
        sa.UniqueConstraint("event_id", name=op.f("uq_schedules_event_id")),
    )


def downgrade() -> None:
    op.drop_table("schedules")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_runs_schedule_key"), type_="unique")
        batch_op.drop_column("schedule_key")

"""queue ownership: a delivery token per take, and withdrawn calls, on the pull work queue

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite cannot add columns with ALTER in every form the others can.
    with op.batch_alter_table("remote_calls") as batch:
        batch.add_column(sa.Column("delivery_token", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("withdrawn_at", PRECISE_DATETIME, nullable=True))
        batch.add_column(sa.Column("withdrawn_reason", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("remote_calls") as batch:
        batch.drop_column("withdrawn_reason")
        batch.drop_column("withdrawn_at")
        batch.drop_column("delivery_token")

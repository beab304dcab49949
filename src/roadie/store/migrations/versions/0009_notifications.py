"""notifications: what operators are told about, and its delivery to each webhook

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLE_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}


def _pk(table: str) -> str | None:
    # MariaDB names every primary key PRIMARY, whatever it is asked for.
    return None if op.get_bind().dialect.name in ("mysql", "mariadb") else op.f(f"pk_{table}")


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dedup_key", sa.String(length=190), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", PRECISE_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=_pk("notifications")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_notifications_dedup_key")),
        **TABLE_OPTIONS,
    )
    op.create_table(
        "webhook_targets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("registered_at", PRECISE_DATETIME, nullable=False),
        sa.Column("claim_token", sa.String(length=64), nullable=True),
        sa.Column("claim_expires", PRECISE_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("name", name=_pk("webhook_targets")),
        **TABLE_OPTIONS,
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("notification_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", PRECISE_DATETIME, nullable=False),
        sa.Column("claim_token", sa.String(length=64), nullable=True),
        sa.Column("claim_expires", PRECISE_DATETIME, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", PRECISE_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["notification_id"],
            ["notifications.id"],
            name=op.f("fk_deliveries_notification_id_notifications"),
        ),
        sa.PrimaryKeyConstraint("id", name=_pk("deliveries")),
        sa.UniqueConstraint("notification_id", "target", name=op.f("uq_deliveries_notification_id_target")),
        **TABLE_OPTIONS,
    )
    op.create_index("ix_deliveries_state_next_at", "deliveries", ["state", "next_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_deliveries_state_next_at", table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("webhook_targets")
    op.drop_table("notifications")

"""remote calls: the pull transport's work queue, and what pulling modules announced

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLE_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}


def _mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "remote_calls",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("idempotency_key", sa.String(length=190), nullable=False),
        sa.Column("call_hash", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", PRECISE_DATETIME, nullable=False),
        sa.Column("visible_at", PRECISE_DATETIME, nullable=False),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("answered_at", PRECISE_DATETIME, nullable=True),
        sa.Column("answer_status", sa.Integer(), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=None if _mysql() else op.f("pk_remote_calls")),
        sa.UniqueConstraint("module", "call_hash", name=op.f("uq_remote_calls_module_call_hash")),
        **TABLE_OPTIONS,
    )
    op.create_index(
        "ix_remote_calls_module_answered_at_visible_at",
        "remote_calls",
        ["module", "answered_at", "visible_at"],
        unique=False,
    )
    op.create_table(
        "remote_modules",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("announced_at", PRECISE_DATETIME, nullable=False),
        sa.Column("polled_at", PRECISE_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("name", name=None if _mysql() else op.f("pk_remote_modules")),
        **TABLE_OPTIONS,
    )


def downgrade() -> None:
    op.drop_table("remote_modules")
    op.drop_index("ix_remote_calls_module_answered_at_visible_at", table_name="remote_calls")
    op.drop_table("remote_calls")

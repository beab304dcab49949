"""tokens and sessions: API tokens with roles, and dashboard sessions

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _mysql() -> bool:
    # MariaDB's primary key is always called PRIMARY, and it warns about any other name.
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", PRECISE_DATETIME, nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("revoked_at", PRECISE_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=None if _mysql() else op.f("pk_api_tokens")),
        sa.UniqueConstraint("key", name=op.f("uq_api_tokens_key")),
        sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
    )
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("created_at", PRECISE_DATETIME, nullable=False),
        sa.Column("expires_at", PRECISE_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], name=op.f("fk_web_sessions_token_id_api_tokens")),
        sa.PrimaryKeyConstraint("id", name=None if _mysql() else op.f("pk_web_sessions")),
        sa.UniqueConstraint("id_hash", name=op.f("uq_web_sessions_id_hash")),
    )
    op.create_index(op.f("ix_web_sessions_expires_at"), "web_sessions", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_web_sessions_expires_at"), table_name="web_sessions")
    op.drop_table("web_sessions")
    op.drop_table("api_tokens")

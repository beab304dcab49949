"""claim tokens: every claim (a step's attempt, a run's cleanup, a lease row's restore)
carries a token minted for it, and every write made under the claim is fenced on it

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from roadie.store.tables import PRECISE_DATETIME

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("claim_token", sa.String(length=64), nullable=True))
    op.add_column("runs", sa.Column("cleanup_token", sa.String(length=64), nullable=True))
    op.add_column("run_resources", sa.Column("claim_token", sa.String(length=64), nullable=True))
    op.add_column("run_resources", sa.Column("claim_expires", PRECISE_DATETIME, nullable=True))


def downgrade() -> None:
    op.drop_column("run_resources", "claim_expires")
    op.drop_column("run_resources", "claim_token")
    op.drop_column("runs", "cleanup_token")
    op.drop_column("steps", "claim_token")

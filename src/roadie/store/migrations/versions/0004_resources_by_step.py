"""resources by step: cleanup reads a run's live rows a page of steps at a time

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_run_resources_step_id_state", "run_resources", ["step_id", "state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_run_resources_step_id_state", table_name="run_resources")

"""resources by run and id: cleanup reads a run's live rows a page at a time, newest first

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_run_resources_run_id_id", "run_resources", ["run_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_run_resources_run_id_id", table_name="run_resources")

"""ready steps in claim order: the index a claim reads is (status, not_before, id)

A claim takes the first ready steps in `(not_before, id)` order. SQLite's index on
`(status, not_before)` ends with the rowid, the id, and InnoDB's with the primary key, so
there the index is already in that order; PostgreSQL's ends with the row's place in the
table, so it read every ready step, joined each to its run and sorted them all to take
the first hundred. With the id in the index it reads the first hundred and stops.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_steps_status_not_before_id", "steps", ["status", "not_before", "id"], unique=False)
    op.drop_index("ix_steps_status_not_before", table_name="steps")


def downgrade() -> None:
    op.create_index("ix_steps_status_not_before", "steps", ["status", "not_before"], unique=False)
    op.drop_index("ix_steps_status_not_before_id", table_name="steps")

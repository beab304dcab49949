"""long event source: an event file's text fits however long an event file may be

MariaDB's TEXT holds 65,535 bytes, and an event file may hold 4,000,000 characters: a
file over 64 KB was refused by the database with its own error. LONGTEXT there; the
other databases' text has no such limit.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.alter_column("events", "source", type_=mysql.LONGTEXT(), existing_type=sa.Text(), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.alter_column("events", "source", type_=sa.Text(), existing_type=mysql.LONGTEXT(), existing_nullable=False)

"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Microseconds everywhere (MariaDB's DATETIME keeps whole seconds by default), Unicode
# and transactions on MariaDB; the other databases ignore the mysql_ options.
DT = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
TABLE_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin", "mysql_engine": "InnoDB"}
LIVE = "state IN ('pending', 'live')"


def _mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def _pk(name: str) -> str | None:
    # MariaDB's primary key is always called PRIMARY, and it warns about any other name.
    return None if _mysql() else op.f(name)


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", DT, nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=_pk("pk_audit")),
        **TABLE_OPTIONS,
    )
    with op.batch_alter_table("audit", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_subject"), ["subject"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("created_at", DT, nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.PrimaryKeyConstraint("id", name=_pk("pk_events")),
        sa.UniqueConstraint("event_id", "version", name=op.f("uq_events_event_id_version")),
        **TABLE_OPTIONS,
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("nonce", sa.String(length=32), nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("event_version", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cleanup_policy", sa.String(length=16), nullable=False),
        sa.Column("cleanup_status", sa.String(length=16), nullable=False),
        sa.Column("phase", sa.Integer(), nullable=False),
        sa.Column("materialised_phase", sa.Integer(), nullable=False),
        sa.Column("phase_due_at", DT, nullable=True),
        sa.Column("ends_at", DT, nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", DT, nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("started_at", DT, nullable=True),
        sa.Column("ended_at", DT, nullable=True),
        sa.Column("cleanup_claimed_by", sa.String(length=100), nullable=True),
        sa.Column("cleanup_claim_expires", DT, nullable=True),
        sa.Column("cleanup_attempts", sa.Integer(), nullable=False),
        sa.Column("cleanup_started_at", DT, nullable=True),
        sa.Column("cleanup_ended_at", DT, nullable=True),
        sa.Column("cleanup_report", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=_pk("pk_runs")),
        **TABLE_OPTIONS,
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_status"), ["status"], unique=False)

    op.create_table(
        "steps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("phase", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=130), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("reversible", sa.String(length=16), nullable=False),
        sa.Column("lease_ref", sa.String(length=190), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("retry", sa.JSON(), nullable=False),
        sa.Column("timeout", sa.Float(), nullable=False),
        sa.Column("on_error", sa.String(length=16), nullable=False),
        sa.Column("not_before", DT, nullable=False),
        sa.Column("claimed_by", sa.String(length=100), nullable=True),
        sa.Column("claim_expires", DT, nullable=True),
        sa.Column("created_at", DT, nullable=False),
        sa.Column("started_at", DT, nullable=True),
        sa.Column("ended_at", DT, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("rejections", sa.JSON(), nullable=True),
        sa.Column("attempt_log", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_steps_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=_pk("pk_steps")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_steps_idempotency_key")),
        sa.UniqueConstraint("run_id", "phase", "seq", name=op.f("uq_steps_run_id_phase_seq")),
        **TABLE_OPTIONS,
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_steps_status_not_before"), ["status", "not_before"], unique=False)

    op.create_table(
        "run_resources",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step_id", sa.Integer(), nullable=True),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("ref", sa.String(length=190), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("until", DT, nullable=True),
        sa.Column("member_key", sa.String(length=190), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", DT, nullable=False),
        sa.Column("updated_at", DT, nullable=False),
        sa.Column("reverted_at", DT, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_resources_run_id_runs")),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=op.f("fk_run_resources_step_id_steps")),
        sa.PrimaryKeyConstraint("id", name=_pk("pk_run_resources")),
        **TABLE_OPTIONS,
    )
    with op.batch_alter_table("run_resources", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_resources_run_id_state"), ["run_id", "state"], unique=False)
        batch_op.create_index(batch_op.f("ix_run_resources_state_kind_until"), ["state", "kind", "until"], unique=False)
    # DESIGN §4 rule 2: at most one row per (owner, kind, ref) among the rows that still
    # hold their target. A partial unique index says exactly that; MariaDB has none, so
    # there a generated column carries the target only while the row holds it (NULL
    # otherwise, and NULLs never collide) and is itself unique.
    if _mysql():
        op.add_column(
            "run_resources",
            sa.Column(
                "live_target",
                sa.String(length=330),
                sa.Computed(f"IF({LIVE}, CONCAT_WS(CHAR(31), owner, kind, ref), NULL)", persisted=True),
            ),
        )
        op.create_index("uq_run_resources_live_target", "run_resources", ["live_target"], unique=True)
    else:
        op.create_index(
            "uq_run_resources_live_target",
            "run_resources",
            ["owner", "kind", "ref"],
            unique=True,
            sqlite_where=sa.text(LIVE),
            postgresql_where=sa.text(LIVE),
        )


def downgrade() -> None:
    op.drop_index("uq_run_resources_live_target", table_name="run_resources")
    with op.batch_alter_table("run_resources", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_resources_state_kind_until"))
        batch_op.drop_index(batch_op.f("ix_run_resources_run_id_state"))

    op.drop_table("run_resources")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_steps_status_not_before"))

    op.drop_table("steps")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_status"))

    op.drop_table("runs")
    op.drop_table("events")
    with op.batch_alter_table("audit", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_subject"))

    op.drop_table("audit")

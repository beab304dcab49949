"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit")),
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
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint("event_id", "version", name=op.f("uq_events_event_id_version")),
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
        sa.Column("phase_due_at", sa.DateTime(), nullable=True),
        sa.Column("ends_at", sa.DateTime(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("cleanup_claimed_by", sa.String(length=100), nullable=True),
        sa.Column("cleanup_claim_expires", sa.DateTime(), nullable=True),
        sa.Column("cleanup_attempts", sa.Integer(), nullable=False),
        sa.Column("cleanup_started_at", sa.DateTime(), nullable=True),
        sa.Column("cleanup_ended_at", sa.DateTime(), nullable=True),
        sa.Column("cleanup_report", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
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
        sa.Column("not_before", sa.DateTime(), nullable=False),
        sa.Column("claimed_by", sa.String(length=100), nullable=True),
        sa.Column("claim_expires", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("rejections", sa.JSON(), nullable=True),
        sa.Column("attempt_log", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_steps_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_steps_idempotency_key")),
        sa.UniqueConstraint("run_id", "phase", "seq", name=op.f("uq_steps_run_id_phase_seq")),
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
        sa.Column("until", sa.DateTime(), nullable=True),
        sa.Column("member_key", sa.String(length=190), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("reverted_at", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_resources_run_id_runs")),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=op.f("fk_run_resources_step_id_steps")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_resources")),
    )
    with op.batch_alter_table("run_resources", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_resources_run_id_state"), ["run_id", "state"], unique=False)
        batch_op.create_index(batch_op.f("ix_run_resources_state_kind_until"), ["state", "kind", "until"], unique=False)
        batch_op.create_index(
            "uq_run_resources_live_target",
            ["owner", "kind", "ref"],
            unique=True,
            sqlite_where=sa.text("state IN ('pending', 'live')"),
            postgresql_where=sa.text("state IN ('pending', 'live')"),
        )


def downgrade() -> None:

    with op.batch_alter_table("run_resources", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_run_resources_live_target",
            sqlite_where=sa.text("state IN ('pending', 'live')"),
            postgresql_where=sa.text("state IN ('pending', 'live')"),
        )
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

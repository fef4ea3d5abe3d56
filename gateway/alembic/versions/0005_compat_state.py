"""compat state: Tinker's and Weaver's sessions, samplers, named sampler weights and calls

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compat_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("protocol", sa.String(16), nullable=False),
        sa.Column("owner_key_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=True),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_compat_sessions_owner_key_id", "compat_sessions", ["owner_key_id"])
    op.create_index("ix_compat_sessions_created_at", "compat_sessions", ["created_at"])
    op.create_table(
        "compat_samplers",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("protocol", sa.String(16), nullable=False),
        sa.Column("owner_key_id", sa.String(64), nullable=False),
        sa.Column("base_model", sa.String(1024), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("model_path", sa.String(2048), nullable=True),
        sa.Column("tokenizer_path", sa.String(2048), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "compat_sampler_weights",
        sa.Column("path", sa.String(2048), primary_key=True),
        sa.Column("owner_key_id", sa.String(64), nullable=True),
        sa.Column("base_model", sa.String(1024), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "compat_calls",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("model_id", sa.String(255), nullable=True),
        sa.Column("seq_id", sa.Integer(), nullable=True),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.Column("released", sa.Boolean(), nullable=False),
        sa.Column("result_json", sa.JSON(), nullable=True),
        sa.Column("result_bytes", sa.LargeBinary(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("model_id", "seq_id", name="uq_compat_calls_seq"),
    )
    op.create_index("ix_compat_calls_created_at", "compat_calls", ["created_at"])


def downgrade() -> None:
    op.drop_table("compat_calls")
    op.drop_table("compat_sampler_weights")
    op.drop_table("compat_samplers")
    op.drop_table("compat_sessions")

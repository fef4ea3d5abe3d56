"""job metrics and samples

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER


def upgrade() -> None:
    op.create_table(
        "job_metrics",
        sa.Column("id", ROW_ID, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "name", "step", name="uq_job_metrics_point"),
    )
    op.create_index("ix_job_metrics_updated_at", "job_metrics", ["updated_at"])
    op.create_table(
        "job_samples",
        sa.Column("id", ROW_ID, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_job_samples_job_id", "job_samples", ["job_id"])


def downgrade() -> None:
    op.drop_table("job_samples")
    op.drop_table("job_metrics")

"""managed runs: job keys

This revision also gave background tasks their `progress` and made the `workers` table: the
worker's history does that now (see 0003).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("job_id", sa.String(64), nullable=True))
        batch.create_foreign_key(
            "fk_api_keys_job_id", "jobs", ["job_id"], ["id"], ondelete="CASCADE"
        )
        batch.create_index("ix_api_keys_job_id", ["job_id"])


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_index("ix_api_keys_job_id")
        batch.drop_constraint("fk_api_keys_job_id", type_="foreignkey")
        batch.drop_column("job_id")

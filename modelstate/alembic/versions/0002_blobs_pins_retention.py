"""blob rows, pins, retention policies, one version per (job, step)

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    blobs = op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("touched_at", sa.DateTime(timezone=True), nullable=False),
    )
    # Every blob a version already references gets its row before the foreign key exists.
    connection = op.get_bind()
    existing = connection.execute(
        sa.text("SELECT sha256, MAX(size) FROM version_files GROUP BY sha256")
    ).all()
    now = datetime.now(UTC)
    if existing:
        op.bulk_insert(
            blobs, [{"sha256": sha, "size": size, "touched_at": now} for sha, size in existing]
        )
    with op.batch_alter_table("version_files") as batch:
        batch.create_foreign_key("fk_files_blob", "blobs", ["sha256"], ["sha256"])
        batch.create_index("ix_version_files_sha256", ["sha256"])
    with op.batch_alter_table("versions") as batch:
        batch.create_unique_constraint("uq_versions_job_step", ["job_id", "step"])
    op.create_table(
        "pins",
        sa.Column("holder", sa.String(256), primary_key=True),
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id", "number"],
            ["versions.job_id", "versions.number"],
            name="fk_pins_version",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "retention",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("keep_last", sa.Integer(), nullable=False),
        sa.Column("keep_ancestors", sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("retention")
    op.drop_table("pins")
    with op.batch_alter_table("versions") as batch:
        batch.drop_constraint("uq_versions_job_step", type_="unique")
    with op.batch_alter_table("version_files") as batch:
        batch.drop_index("ix_version_files_sha256")
        batch.drop_constraint("fk_files_blob", type_="foreignkey")
    op.drop_table("blobs")

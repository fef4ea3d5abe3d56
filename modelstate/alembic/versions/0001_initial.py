"""versions, version_files, aliases

Revision ID: 0001
Revises:
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
        "versions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("base_model", sa.String(1024), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "number", name="uq_versions_job_number"),
    )
    op.create_table(
        "version_files",
        sa.Column(
            "version_id",
            sa.Integer(),
            sa.ForeignKey("versions.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("path", sa.String(1024), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
    )
    op.create_table(
        "aliases",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id", "number"],
            ["versions.job_id", "versions.number"],
            name="fk_aliases_version",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("aliases")
    op.drop_table("version_files")
    op.drop_table("versions")

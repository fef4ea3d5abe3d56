"""background tasks and workers, adopted from the gateway's history

The gateway's revisions 0003 and 0004 made these tables until the worker took them over: a
database they migrated already has them, and keeps them with their rows. So each table,
column and index here is created only when missing; a fresh database ends with what those
revisions made. A task refers to the gateway's `jobs`, so the gateway's history runs first
(the worker retries its migrations at start until it has).

Revision ID: 0001
Revises:
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from services.worker.models import JOBS_TABLE, GatewayNotMigrated

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    if not _inspect().has_table(JOBS_TABLE):
        raise GatewayNotMigrated(
            f"The gateway's {JOBS_TABLE!r} table, which background tasks "
            "refer to, does not exist yet: the gateway migrates it."
        )
    if not _inspect().has_table("background_tasks"):
        op.create_table(
            "background_tasks",
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column(
                "job_id",
                sa.String(64),
                sa.ForeignKey(f"{JOBS_TABLE}.id", ondelete="CASCADE"),
                nullable=True,
            ),
            sa.Column("kind", sa.String(32), nullable=False),
            sa.Column("params", sa.JSON(), nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("result", sa.JSON(), nullable=True),
            sa.Column("error", sa.JSON(), nullable=True),
            sa.Column("attempts", sa.Integer(), nullable=False),
            sa.Column("idempotency_key", sa.String(128), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
            sa.UniqueConstraint(
                "job_id", "idempotency_key", name="uq_background_tasks_idempotency"
            ),
        )
    indexes = {index["name"] for index in _inspect().get_indexes("background_tasks")}
    for column in ("job_id", "status", "created_at"):
        if f"ix_background_tasks_{column}" not in indexes:
            op.create_index(f"ix_background_tasks_{column}", "background_tasks", [column])
    # Made by the gateway's 0003 but not yet its 0004: no `progress` column.
    if "progress" not in {c["name"] for c in _inspect().get_columns("background_tasks")}:
        op.add_column("background_tasks", sa.Column("progress", sa.JSON(), nullable=True))
    if not _inspect().has_table("workers"):
        op.create_table(
            "workers",
            sa.Column("id", sa.String(255), primary_key=True),
            sa.Column("pid", sa.Integer(), nullable=False),
            sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        )


def _inspect() -> sa.Inspector:
    """A fresh inspector: one made earlier remembers the database before the steps above."""
    return sa.inspect(op.get_bind())


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_table("background_tasks")

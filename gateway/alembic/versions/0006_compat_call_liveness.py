"""compat calls: when the gateway replica running a call last said it still runs it

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null on rows made before: their creation time stands in for it.
    op.add_column("compat_calls", sa.Column("alive_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("compat_calls", "alive_at")

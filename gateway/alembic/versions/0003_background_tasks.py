"""background tasks (now the worker's history)

This revision made the `background_tasks` table. The worker owns it now, with a history of
its own (`services/worker/alembic`), whose first revision makes it where it is missing and
adopts it, with its rows, where this revision made it. Kept, empty, so that databases at or
past it keep their place in the chain.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass

"""A database holding background tasks: the gateway's history first (tasks refer to its
jobs), then the worker's, as the gateway migrates at its start."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.orm import Session, sessionmaker

from gateway import models as gateway_models
from services.common.db import make_engine, make_sessionmaker, migrate
from services.worker import models as worker_models


def migrate_both(url: str) -> None:
    migrate(url, gateway_models.ALEMBIC_DIR, gateway_models.VERSION_TABLE)
    migrate(url, worker_models.ALEMBIC_DIR, worker_models.VERSION_TABLE)


def task_sessions(url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on `url` migrated by both histories, its engine disposed after (for a
    fixture: `yield from task_sessions(...)`)."""
    migrate_both(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()

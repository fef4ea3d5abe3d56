"""Fixtures of the gateway's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.models import ALEMBIC_DIR, VERSION_TABLE
from services.common.db import make_engine, make_sessionmaker, migrate


@pytest.fixture
def gateway_db(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """The gateway's database, migrated, on SQLite in a temporary directory."""
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    migrate(url, ALEMBIC_DIR, VERSION_TABLE)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()

"""The Alembic history builds exactly the tables the ORM models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gateway.compat.common import rows as compat_rows  # noqa: F401 - the compat tables
from gateway.models import ALEMBIC_DIR, VERSION_TABLE, Base
from services.common.db import make_engine, migrate


def test_migrations_match_models(empty_database_url: str) -> None:
    migrate(empty_database_url, ALEMBIC_DIR, VERSION_TABLE)
    migrate(empty_database_url, ALEMBIC_DIR, VERSION_TABLE)  # idempotent
    engine = make_engine(empty_database_url)
    with engine.connect() as connection:
        # The gateway's tables only, as its env.py compares them (the database holds other
        # services' tables too: the worker's, made by its own history).
        context = MigrationContext.configure(
            connection,
            opts={
                "compare_type": True,
                "version_table": VERSION_TABLE,
                "include_name": lambda name, type_, _parents: (
                    type_ != "table" or name in Base.metadata.tables
                ),
            },
        )
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == []

"""The Alembic history builds exactly the tables the ORM models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gateway.models import ALEMBIC_DIR, VERSION_TABLE, Base
from services.common.db import make_engine, migrate


def test_migrations_match_models(database_url: str) -> None:
    migrate(database_url, ALEMBIC_DIR, VERSION_TABLE)
    migrate(database_url, ALEMBIC_DIR, VERSION_TABLE)  # idempotent
    engine = make_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={
            "compare_type": True, "version_table": VERSION_TABLE})
        diff = [d for d in compare_metadata(context, Base.metadata)
                if not (d[0] == "remove_table" and d[1].name.startswith("alembic_version"))]
    engine.dispose()
    assert diff == []

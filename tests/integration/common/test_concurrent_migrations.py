"""Services that start at once against one fresh PostgreSQL database (rollout replicas
scaled up together, a compose stack) each migrate it: every one must start. Before the
migration lock, two rollout replicas raced to create their version table and one exited."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.integration

PROCESSES = 6


def _migrate(url: str, alembic_dir: str, version_table: str) -> None:
    from services.common.db import migrate

    migrate(url, Path(alembic_dir), version_table)


def test_services_migrating_one_database_at_once_all_succeed(empty_postgres_url: str) -> None:
    from services.rollout.app import ALEMBIC_DIR, VERSION_TABLE

    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    processes = [
        context.Process(
            target=_after, args=(start, empty_postgres_url, str(ALEMBIC_DIR), VERSION_TABLE)
        )
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=180)
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    url = empty_postgres_url
    engine = create_engine(
        url.replace("postgresql://", "postgresql+psycopg://", 1)
        if url.startswith("postgresql://")
        else url
    )
    with engine.connect() as connection:
        versions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    engine.dispose()
    assert len(versions) == 1  # one history, at one head


def _after(start: object, url: str, alembic_dir: str, version_table: str) -> None:
    # Everything imported before the start line, so the processes reach the database at once.
    import alembic.command  # noqa: F401

    import services.common.alembic_env  # noqa: F401
    import services.rollout.capture.models  # noqa: F401

    start.wait(timeout=60)  # type: ignore[attr-defined]
    _migrate(url, alembic_dir, version_table)

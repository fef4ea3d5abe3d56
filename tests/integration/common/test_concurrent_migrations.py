"""Services that start at once against one fresh database (rollout replicas scaled up
together, a compose stack on PostgreSQL; the gateway and the worker of `loom up`, which both
migrate the worker's tables, on SQLite) each migrate it: every one must start. Before the
migration locks, two rollout replicas raced to create their version table and one exited, and
`loom up`'s gateway now and then lost the same race to the worker and exited."""

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


@pytest.fixture(params=["postgresql", "sqlite"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


def test_services_migrating_one_database_at_once_all_succeed(fresh_url: str) -> None:
    from services.rollout.app import ALEMBIC_DIR, VERSION_TABLE

    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    processes = [
        context.Process(target=_after, args=(start, fresh_url, str(ALEMBIC_DIR), VERSION_TABLE))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=180)
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    url = fresh_url
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

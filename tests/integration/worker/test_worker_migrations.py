"""The worker's own migration history: on a fresh database (after the gateway's) it makes the
tables the gateway's revisions 0003 and 0004 used to make; on a database those revisions
made (an existing deployment) it adopts them with their rows; before the gateway's `jobs`
exists it refuses, so the worker waits for the gateway."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    inspect,
    text,
)

from gateway import models as gateway_models
from services.common.db import make_engine, migrate
from services.worker import models as worker_models
from services.worker.models import ALEMBIC_DIR, VERSION_TABLE, GatewayNotMigrated
from tests.support.task_tables import migrate_both


def schema_diff(url: str) -> list[Any]:
    """How the database's worker tables differ from the worker's models, leaving out the one
    foreign key only the migrations declare (tasks → the gateway's jobs)."""
    engine = make_engine(url)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "compare_type": True,
                "version_table": VERSION_TABLE,
                "include_name": lambda name, type_, _parents: (
                    type_ != "table" or name in worker_models.Base.metadata.tables
                ),
            },
        )
        diff = compare_metadata(context, worker_models.Base.metadata)
        [fk] = inspect(connection).get_foreign_keys("background_tasks")
    engine.dispose()
    assert (
        fk["constrained_columns"],
        fk["referred_table"],
        fk["referred_columns"],
        fk["options"].get("ondelete"),
    ) == (["job_id"], "jobs", ["id"], "CASCADE")
    return [d for d in diff if d[0] != "remove_fk"]


def test_a_fresh_database_gets_the_tables_as_the_gateway_made_them(empty_database_url: str) -> None:
    with pytest.raises(GatewayNotMigrated):  # the worker first: it waits for the gateway
        migrate(empty_database_url, ALEMBIC_DIR, VERSION_TABLE)
    migrate_both(empty_database_url)
    migrate(empty_database_url, ALEMBIC_DIR, VERSION_TABLE)  # again: nothing to do
    assert schema_diff(empty_database_url) == []


def old_gateway_tables(metadata: MetaData, *, managed_runs: bool) -> list[Table]:
    """The tables as the gateway's history made them: its 0003 (background_tasks), and with
    its 0004 (`managed_runs`) the `progress` column and the `workers` table."""
    tasks = Table(
        "background_tasks",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True),
        Column("kind", String(32), nullable=False),
        Column("params", JSON(), nullable=False),
        Column("status", String(16), nullable=False),
        Column("result", JSON(), nullable=True),
        Column("error", JSON(), nullable=True),
        Column("attempts", Integer(), nullable=False),
        Column("idempotency_key", String(128), nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=True),
        Column("finished_at", DateTime(timezone=True), nullable=True),
        Column("heartbeat_at", DateTime(timezone=True), nullable=True),
        *([Column("progress", JSON(), nullable=True)] if managed_runs else []),
        UniqueConstraint("job_id", "idempotency_key", name="uq_background_tasks_idempotency"),
    )
    for column in ("job_id", "status", "created_at"):
        Index(f"ix_background_tasks_{column}", tasks.c[column])
    if not managed_runs:
        return [tasks]
    workers = Table(
        "workers",
        metadata,
        Column("id", String(255), primary_key=True),
        Column("pid", Integer(), nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=False),
        Column("seen_at", DateTime(timezone=True), nullable=False),
    )
    return [tasks, workers]


@pytest.mark.parametrize("managed_runs", [True, False], ids=["gateway-at-0004", "at-0003"])
def test_a_database_the_gateways_history_made_is_adopted_with_its_rows(
    empty_database_url: str, managed_runs: bool
) -> None:
    url = empty_database_url
    migrate(url, gateway_models.ALEMBIC_DIR, gateway_models.VERSION_TABLE)
    engine = make_engine(url)
    with engine.begin() as connection:  # the tables and rows an existing deployment has
        metadata = MetaData()
        Table("jobs", metadata, autoload_with=connection)
        metadata.create_all(
            connection, tables=old_gateway_tables(metadata, managed_runs=managed_runs)
        )
        connection.execute(
            text(
                "INSERT INTO jobs (id, name, base_model, mode, config, status, created_at) "
                "VALUES ('job_1', 'j', 'm', 'lora', '{}', 'running', CURRENT_TIMESTAMP)"
            )
        )
        progress = ", progress" if managed_runs else ""
        connection.execute(
            text(
                f"INSERT INTO background_tasks (id, job_id, kind, params, status, attempts, "
                f"idempotency_key, created_at{progress}) VALUES ('task_1', 'job_1', 'recipe', "
                f"'{{\"recipe\": \"r\"}}', 'running', 2, 'k1', CURRENT_TIMESTAMP"
                f"{', :progress' if managed_runs else ''})"
            ),
            {"progress": '{"step": 4, "checkpoint": "c4"}'},
        )
        if managed_runs:
            connection.execute(
                text(
                    "INSERT INTO workers (id, pid, started_at, seen_at) VALUES "
                    "('w1', 7, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )

    migrate(url, ALEMBIC_DIR, VERSION_TABLE)  # the worker's history adopts them

    with engine.connect() as connection:
        task = connection.execute(
            text(
                "SELECT job_id, kind, status, attempts, idempotency_key, progress "
                "FROM background_tasks"
            )
        ).one()
        workers = connection.execute(text("SELECT id, pid FROM workers")).all()
        version = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).one()
    engine.dispose()
    assert task[:5] == ("job_1", "recipe", "running", 2, "k1")
    progress_kept = {"step": 4, "checkpoint": "c4"} if managed_runs else None
    assert (
        task[5] if not isinstance(task[5], str) else __import__("json").loads(task[5])
    ) == progress_kept
    assert workers == ([("w1", 7)] if managed_runs else [])
    assert version == ("0001",)
    assert schema_diff(url) == []


def _start(start: Any, url: str, role: str) -> None:
    """What a process does at start: a gateway migrates both histories, a worker its own
    once the gateway's `jobs` exists (`migrate_when_ready`)."""
    from services.worker.startup import migrate_when_ready

    start.wait(timeout=60)
    if role == "gateway":
        migrate_both(url)
    else:
        migrate_when_ready(url, timeout_s=60)


def test_workers_and_gateways_starting_at_once_all_end_migrated(empty_postgres_url: str) -> None:
    roles = ["worker", "worker", "worker", "gateway", "gateway"]  # the workers win the race
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(len(roles))
    processes = [
        context.Process(target=_start, args=(start, empty_postgres_url, role)) for role in roles
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=180)
    assert [process.exitcode for process in processes] == [0] * len(roles)
    assert schema_diff(empty_postgres_url) == []

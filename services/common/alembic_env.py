"""The body of every service's `alembic/env.py`: online migrations with a per-service
version table (set by `db.migrate`), type comparison on, SQLite batch mode for ALTERs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from collections.abc import Iterator
from pathlib import Path

from alembic import context
from sqlalchemy import Engine, MetaData, make_url, text

from services.common.db import make_engine


def run_migrations(target_metadata: MetaData, default_version_table: str) -> None:
    config = context.config
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("alembic: sqlalchemy.url is not set (use services.common.db.migrate)")
    version_table = config.attributes.get("version_table", default_version_table)
    engine = make_engine(url)
    try:
        _run(engine, url, target_metadata, version_table)
    finally:
        # Also when a migration fails (the worker's wait for the gateway's tables): an SQLite
        # connection left open in a process that then forks (Celery's pool) breaks SQLite's
        # locking, and the database can be corrupted.
        engine.dispose()


def _run(engine: Engine, url: str, target_metadata: MetaData, version_table: str) -> None:
    with sqlite_migration_lock(url), engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=version_table,
            compare_type=True,
            # Services may share one PostgreSQL database: only ever touch our own tables.
            include_name=lambda name, type_, _parents: (
                type_ != "table" or name in target_metadata.tables
            ),
            render_as_batch=url.startswith("sqlite"),
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # Replicas started at once migrate one shared database: without a lock two
                # both find no version table and race to create it (one fails to start).
                # The lock ends with the transaction; the one that waited finds it at head.
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"),
                    {"key": migration_lock_key(version_table)},
                )
            context.run_migrations()
        connection.commit()


@contextlib.contextmanager
def sqlite_migration_lock(url: str) -> Iterator[None]:
    """Processes migrating one SQLite file take turns (an exclusive lock on a file beside
    it): SQLite runs DDL outside a transaction, so two processes started at once (the gateway
    and the worker both migrate the worker's tables) would both find no version table and race
    to create it, and one would fail to start. PostgreSQL has its advisory lock instead."""
    database = make_url(url).database if url.startswith("sqlite") else None
    if not database or database == ":memory:":
        yield
        return
    with open(Path(f"{database}.migrate.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def migration_lock_key(version_table: str) -> int:
    """A PostgreSQL advisory lock key (a signed 64-bit integer) of one migration history."""
    digest = hashlib.sha256(f"loom-migrations:{version_table}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)

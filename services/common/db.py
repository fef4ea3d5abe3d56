"""Database layer: SQLAlchemy 2 engines and sessions, Alembic migrations per owning service.

Each service that owns tables keeps its own Alembic history (`<package>/alembic`) with its own
version table, so services can share one PostgreSQL database without sharing a migration chain.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, Text, TypeDecorator, create_engine, event, text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


NUL_STAND_IN = "\ufffd"


class SampledText(TypeDecorator[str]):
    """Text a model sampled (or a prompt it was given), storable on every database.
    PostgreSQL's text refuses NUL characters, and a byte-level tokenizer has a token that
    decodes to one; each is stored as U+FFFD instead, on SQLite too, so both read back the
    same. The token ids, kept beside such text, stay exact."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else value.replace("\x00", NUL_STAND_IN)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session


async def in_transaction(sessions: sessionmaker[Session], work: Callable[[Session], T]) -> T:
    """Run blocking database work in one transaction, off the event loop."""

    def run() -> T:
        with transaction(sessions) as session:
            return work(session)

    return await run_in_threadpool(run)


def migrate(url: str, alembic_dir: Path, version_table: str | None = None) -> None:
    """Bring the database to the latest revision of one service's migration history (its
    version table: `version_table`, else the one its env.py names)."""
    config = Config()
    config.set_main_option("script_location", str(alembic_dir))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if version_table is not None:
        config.attributes["version_table"] = version_table
    command.upgrade(config, "head")


@contextmanager
def scratch_database(admin_url: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """The URL of a new PostgreSQL database on the server of `admin_url`, empty or a copy of
    the database `template`, dropped afterwards (for tests and benchmarks)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        copy = f' TEMPLATE "{template}"' if template else ""
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

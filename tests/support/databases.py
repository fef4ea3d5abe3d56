"""The migrated template that tests' PostgreSQL databases are copied from.

Every service's Alembic history is brought to head once per test session, in a template
database; each test then gets `CREATE DATABASE ... TEMPLATE` of it, a file copy, instead of
running the migrations again (services a test starts still migrate at start and find the
database at head). The template's name carries a hash of the migration files, so a changed
migration makes a new template.

Several pytest processes may share one server. Building takes an exclusive advisory lock (one
builder at a time, the others then find it built); each session holds a shared lock on the
template it copies from until it ends; at its end a session drops every template that no
session holds, its own included once no other uses it (and any left half-built by a crash).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine, text

from services.common.db import migrate

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "loom_template_"
BUILD_LOCK = "build"


def migration_histories() -> list[Path]:
    """Every service's Alembic directory, in path order (each env.py names its own version
    table; a history whose tables refer to another's must sort after it)."""
    return sorted(
        path.parent
        for pattern in ("*/alembic/env.py", "services/*/alembic/env.py")
        for path in ROOT.glob(pattern)
    )


def template_name(histories: list[Path]) -> str:
    """`loom_template_<hash>` of the histories' files and the shared migration environment."""
    digest = hashlib.sha256()
    files = [
        ROOT / "services/common/alembic_env.py",
        *(path for history in histories for path in sorted(history.rglob("*.py"))),
    ]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return PREFIX + digest.hexdigest()[:16]


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory lock key of one name."""
    return int.from_bytes(
        hashlib.sha256(f"loom-test-template:{name}".encode()).digest()[:8], "big", signed=True
    )


def _lock(held: Connection, name: str, how: str) -> bool:
    """Take (pg_advisory_lock[_shared]), try (pg_try_...) or release (pg_advisory_unlock...)
    the session-level advisory lock of `name` on the connection `held`."""
    return bool(held.execute(text(f"SELECT {how}(:key)"), {"key": _lock_key(name)}).scalar())


@contextmanager
def migrated_template(admin_url: str) -> Iterator[str]:
    """The name of a template database on the server of `admin_url` with every history at
    head, held for the duration of the block (see the module's docstring)."""
    histories = migration_histories()
    name = template_name(histories)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as held:
            _lock(held, BUILD_LOCK, "pg_advisory_lock")
            try:
                if name not in _templates(held):
                    _build(held, admin_url, name, histories)
                _lock(held, name, "pg_advisory_lock_shared")
            finally:
                _lock(held, BUILD_LOCK, "pg_advisory_unlock")
            try:
                yield name
            finally:
                _lock(held, BUILD_LOCK, "pg_advisory_lock")
                _lock(held, name, "pg_advisory_unlock_shared")
                _drop_unused(held)
                _lock(held, BUILD_LOCK, "pg_advisory_unlock")
    finally:
        admin.dispose()


def _templates(held: Connection) -> list[str]:
    return list(
        held.execute(
            text("SELECT datname FROM pg_database WHERE datname LIKE :like"),
            {"like": PREFIX.replace("_", r"\_") + "%"},
        ).scalars()
    )


def _build(held: Connection, admin_url: str, name: str, histories: list[Path]) -> None:
    """Migrate under a name of its own, then rename: a template under `name` is complete."""
    building = f"{name}_{uuid.uuid4().hex[:8]}"
    held.execute(text(f'CREATE DATABASE "{building}"'))
    try:
        for history in histories:
            migrate(admin_url.rsplit("/", 1)[0] + f"/{building}", history)
        held.execute(text(f'ALTER DATABASE "{building}" RENAME TO "{name}"'))
    except BaseException:
        held.execute(text(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)'))
        raise
    # Copying needs a template nobody is connected to.
    held.execute(text(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false'))


def _drop_unused(held: Connection) -> None:
    """Drop every template no session holds (under the build lock, so none is being taken)."""
    for name in _templates(held):
        if _lock(held, name, "pg_try_advisory_lock"):
            held.execute(text(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false'))
            held.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            _lock(held, name, "pg_advisory_unlock")

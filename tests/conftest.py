"""Shared fixtures. Integration tests use real services; in CI (CI=true) a missing one is a
failure, never a skip."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_ADMIN_URL = os.environ.get(
    "LOOM_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("LOOM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CACHE = Path(__file__).resolve().parent.parent / ".loom-test-cache"
UNIT_TESTS = Path(__file__).resolve().parent / "unit"
# One deployment per test session: every service a test builds, whatever its data dir, asks
# for the same service token, as the processes of one Loom do (tests of where the token comes
# from clear this). Set before any settings are built, so subprocesses inherit it too.
os.environ.setdefault("LOOM_SERVICE_TOKEN", secrets.token_urlsafe(32))


def require(condition: bool, what: str) -> None:
    """Skip locally when a real service is missing; fail in CI."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} not available")


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def require_postgres(request: pytest.FixtureRequest) -> None:
    """PostgreSQL for a test outside the unit tier (`make test-fast` runs tests/unit with no
    services: a unit test that needs the database is marked integration, as database_url's
    PostgreSQL run is)."""
    unit = UNIT_TESTS in request.path.parents
    if unit and request.node.get_closest_marker("integration") is None:
        pytest.fail(f"{request.node.nodeid} is a unit test: mark it integration to use PostgreSQL")
    require(port_open("127.0.0.1", 5432), "PostgreSQL on 127.0.0.1:5432")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The deterministic tiny model, built once per checkout (cached between runs)."""
    from services.common.base_models import ensure_tiny_model

    return ensure_tiny_model(CACHE / "models" / "tiny")


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """The session's PostgreSQL template database, every service's migrations at head
    (tests/support/databases.py)."""
    require(port_open("127.0.0.1", 5432), "PostgreSQL on 127.0.0.1:5432")
    from tests.support.databases import migrated_template

    with migrated_template(PG_ADMIN_URL) as name:
        yield name


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database for one test with every service's migrations at head (a
    copy of the template), dropped afterwards."""
    require_postgres(request)
    from services.common.db import scratch_database

    template = request.getfixturevalue("postgres_template")
    with scratch_database(PG_ADMIN_URL, "loom_test", template=template) as url:
        yield url


@pytest.fixture
def empty_postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (of migrations), dropped afterwards."""
    require_postgres(request)
    from services.common.db import scratch_database

    with scratch_database(PG_ADMIN_URL, "loom_test") as url:
        yield url


BOTH_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]


def _on_backend(request: pytest.FixtureRequest, tmp_path: Path, postgres: str) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'loom.db'}"
    return str(request.getfixturevalue(postgres))


@pytest.fixture(params=BOTH_BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Run a test on both database backends (the PostgreSQL run is integration-tier: a test of
    tests/unit that takes this runs on SQLite alone in `make test-fast`). The PostgreSQL
    database has every service's migrations at head already; the SQLite one is empty."""
    return _on_backend(request, tmp_path, "postgres_url")


@pytest.fixture(params=BOTH_BACKENDS)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """`database_url` with an empty database on both backends (for tests of migrations)."""
    return _on_backend(request, tmp_path, "empty_postgres_url")


def migrated_engine(url: str, alembic_dir: Path, version_table: str) -> Iterator[Any]:
    """A database engine on `url` with one service's migrations applied, disposed after (for
    a service's engine fixture: `yield from migrated_engine(...)`)."""
    from services.common.db import make_engine, migrate

    migrate(url, alembic_dir, version_table)
    engine = make_engine(url)
    yield engine
    engine.dispose()

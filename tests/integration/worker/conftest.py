"""Background tasks end to end: the gateway (uvicorn in a thread) on PostgreSQL, a real
modelstate service, Redis as the broker (a key prefix and queue of its own per test) or the
filesystem broker, and real Celery workers as subprocesses (`python -m services.worker`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import port_open, require
from tests.support.worker import WORKER_REDIS_URL, TaskStack, build_stack


def redis_available() -> None:
    require(port_open("127.0.0.1", 6379), "Redis on 127.0.0.1:6379")


@pytest.fixture
def queue() -> Iterator[str]:
    """A Redis key prefix (and queue name) of this test's own; its keys are deleted after."""
    redis_available()
    import redis

    name = f"loom-test-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(WORKER_REDIS_URL)
    for key in client.scan_iter(match=f"{name}*"):
        client.delete(key)
    client.close()


@pytest.fixture
def stack(
    tmp_path: Path, postgres_url: str, tiny_model_dir: Path, queue: str
) -> Iterator[TaskStack]:
    """PostgreSQL and Redis."""
    yield from build_stack(
        tmp_path,
        postgres_url,
        tiny_model_dir,
        {
            "LOOM_WORKER_BROKER_URL": WORKER_REDIS_URL,
            "LOOM_WORKER_QUEUE": queue,
            "LOOM_WORKER_REDIS_PREFIX": f"{queue}:",
            "LOOM_WORKER_VISIBILITY_TIMEOUT_S": "5",
        },
    )


@pytest.fixture
def run_stack(
    tmp_path: Path, postgres_url: str, tiny_model_dir: Path, queue: str
) -> Iterator[TaskStack]:
    """PostgreSQL, Redis and a real trainer (restartable): for managed runs."""
    yield from build_stack(
        tmp_path,
        postgres_url,
        tiny_model_dir,
        {
            "LOOM_WORKER_BROKER_URL": WORKER_REDIS_URL,
            "LOOM_WORKER_QUEUE": queue,
            "LOOM_WORKER_REDIS_PREFIX": f"{queue}:",
            "LOOM_WORKER_VISIBILITY_TIMEOUT_S": "5",
        },
        real_trainer=True,
    )

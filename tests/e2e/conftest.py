"""The whole stack as real local processes (`loom up`'s supervisor) on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.supervisor import Supervisor
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(gateway url, admin key, data dir) of a running stack, shared by the e2e modules."""
    data_dir = tmp_path_factory.mktemp("loom-stack")
    urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
    settings = LoomSettings(data_dir=data_dir, **urls)
    # Shards of 1 MiB: the tiny model's full weights reach rollout in several files, as a
    # real model's do.
    with Supervisor(settings, extra_env={"LOOM_TRAINER_SHARD_MB": "1"}) as supervisor:
        supervisor.start()
        key = (data_dir / "admin_key").read_text().strip()
        yield settings.gateway_url, key, data_dir

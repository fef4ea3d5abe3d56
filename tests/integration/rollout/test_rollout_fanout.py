"""Weight fan-out between two real rollout replicas (processes, each its own vLLM engine and
cache directory, reading nothing in the store's directory): the first fetches a published
LoRA version from the store; the second, started afterwards, fetches it from the first (by
content, over HTTP), and the store serves no file more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from modelstate.app import create_app as create_modelstate_app
from modelstate.client import ModelStateClient
from modelstate.schemas import VersionKind, VersionMeta
from modelstate.settings import ModelStateSettings
from services.common.ports import free_port
from services.common.service_token import service_headers
from tests.integration.rollout.test_rollout_replicas import PROMPT, READY_TIMEOUT_S, wait_for
from tests.support.adapters import lora_adapter
from tests.support.rollout_process import RolloutProcess
from tests.support.servers import serve_in_thread

JOB = "fanout-job"
STORE_FILES_ROUTE = 'route="/v1/jobs/{job_id}/versions/{ref}/files/{path:path}"'
PEER_BLOBS_ROUTE = 'route="/v1/blobs/{sha256}"'


@pytest.fixture
def stack(tiny_model_dir: Path, postgres_url: str, tmp_path: Path) -> Iterator[dict]:
    port = free_port()
    settings = GatewaySettings(
        data_dir=tmp_path / "data",
        database_url=postgres_url,
        gateway_url=f"http://127.0.0.1:{port}",
        rollout_url=f"http://127.0.0.1:{free_port()}",
        gateway_replica_missed_heartbeats=20,
    )
    modelstate = create_modelstate_app(ModelStateSettings(data_dir=settings.data_dir))
    with (
        serve_in_thread(create_app(settings), port) as url,
        serve_in_thread(modelstate) as store_url,
    ):
        processes = [
            RolloutProcess(
                data_dir=settings.data_dir,
                model_dir=tiny_model_dir,
                gateway_url=url,
                env={
                    "LOOM_DATABASE_URL": postgres_url,
                    "LOOM_MODELSTATE_URL": store_url,
                    "LOOM_ROLLOUT_STORE_LOCAL_READS": "false",  # as on other hosts
                    "LOOM_ROLLOUT_CACHE_DIR": str(tmp_path / f"cache-{name}"),
                    "VLLM_CPU_OMP_THREADS_BIND": str(core),
                },
            )
            for core, name in enumerate("ab")
        ]
        try:
            yield {
                "url": url,
                "key": settings.admin_key_file.read_text().strip(),
                "store": store_url,
                "processes": processes,
                "settings": settings,
                "caches": [tmp_path / "cache-a", tmp_path / "cache-b"],
            }
        finally:
            for process in processes:
                process.stop()


def counted(metrics: str, route: str) -> int:
    """Successful requests of `route` in a service's /metrics."""
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metrics.splitlines()
        if line.startswith("loom_http_requests_total{")
        and route in line
        and ('status="200"' in line or 'status="206"' in line)
    )


async def test_the_second_replica_fetches_the_version_from_the_first(
    stack: dict, tiny_model_dir: Path, tmp_path: Path
) -> None:
    a, b = stack["processes"]
    token = service_headers(stack["settings"])
    gateway = httpx2.AsyncClient(
        base_url=stack["url"], timeout=120, headers={"Authorization": f"Bearer {stack['key']}"}
    )
    store_metrics = httpx2.AsyncClient(base_url=stack["store"], timeout=30)
    store = ModelStateClient(stack["store"], headers=token)

    async def holding(process: RolloutProcess) -> bool:
        assert process.process is not None and process.process.poll() is None, (
            process.log_path.read_text()[-3000:]
        )
        table = (await gateway.get("/v1/rollout/replicas")).json()["replicas"]
        return any(
            r["id"] == process.replica_id
            and r["ready"]
            and {"job_id": JOB, "number": 1, "kind": "lora"} in r["versions"]
            for r in table
        )

    async def ready(process: RolloutProcess) -> bool:
        assert process.process is not None and process.process.poll() is None, (
            process.log_path.read_text()[-3000:]
        )
        table = (await gateway.get("/v1/rollout/replicas")).json()["replicas"]
        return any(r["id"] == process.replica_id and r["ready"] for r in table)

    async def sample_on(process: RolloutProcess) -> dict:
        async with httpx2.AsyncClient(base_url=process.url, timeout=120, headers=token) as direct:
            response = await direct.post(
                "/v1/sample",
                json={
                    "job_id": JOB,
                    "version": 1,
                    "prompt_token_ids": PROMPT,
                    "params": {"max_tokens": 4, "seed": 1},
                },
            )
        assert response.status_code == 200, response.text
        return response.json()

    try:
        a.start()
        await wait_for(lambda: ready(a), "replica a ready", READY_TIMEOUT_S)
        adapter = lora_adapter(tiny_model_dir, tmp_path / "lora", seed=3, rank=8)
        version = await store.publish(
            VersionMeta(job_id=JOB, kind=VersionKind.lora, base_model=str(tiny_model_dir)), adapter
        )
        files = len(version.files)
        first = await sample_on(a)
        assert first["version"] == 1
        await wait_for(lambda: holding(a), "replica a to report version 1", 30)
        from_store = counted((await store_metrics.get("/metrics")).text, STORE_FILES_ROUTE)
        assert from_store == files  # a's copy came from the store

        started = time.monotonic()
        b.start()
        await wait_for(lambda: ready(b), "replica b ready", READY_TIMEOUT_S)
        second = await sample_on(b)
        assert second["version"] == 1
        assert second["samples"][0]["token_ids"] == first["samples"][0]["token_ids"]
        assert (
            counted((await store_metrics.get("/metrics")).text, STORE_FILES_ROUTE) == from_store
        )  # the store served b nothing
        async with httpx2.AsyncClient(base_url=a.url, timeout=30) as peer:
            assert counted((await peer.get("/metrics")).text, PEER_BLOBS_ROUTE) == files
        copied = sorted(p.name for p in (stack["caches"][1] / JOB / "1").iterdir())
        assert copied == sorted(Path(f.path).name for f in version.files)
        print(f"\nb started and fetched version 1 from a in {time.monotonic() - started:.1f} s")
    finally:
        await asyncio.gather(gateway.aclose(), store_metrics.aclose(), store.aclose())

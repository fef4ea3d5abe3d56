"""Weight fan-out between three real rollout replicas (processes, each its own vLLM engine and
cache directory, reading nothing in the store's directory): a LoRA version published while all
three run reaches them at once; they claim it at the gateway in turn and fetch it as a chain
(by content, over HTTP, each from the one that claimed before), so the store serves each file
once, not three times."""

from __future__ import annotations

import asyncio
import os
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
CORES = os.cpu_count() or 1


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
                    "VLLM_CPU_OMP_THREADS_BIND": str(index % CORES),
                },
            )
            for index, name in enumerate("abc")
        ]
        try:
            yield {
                "url": url,
                "key": settings.admin_key_file.read_text().strip(),
                "store": store_url,
                "processes": processes,
                "settings": settings,
                "caches": [tmp_path / f"cache-{name}" for name in "abc"],
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


async def test_replicas_a_publish_reaches_at_once_fetch_it_as_a_chain(
    stack: dict, tiny_model_dir: Path, tmp_path: Path
) -> None:
    processes = stack["processes"]
    token = service_headers(stack["settings"])
    gateway = httpx2.AsyncClient(
        base_url=stack["url"], timeout=120, headers={"Authorization": f"Bearer {stack['key']}"}
    )
    store_metrics = httpx2.AsyncClient(base_url=stack["store"], timeout=30)
    store = ModelStateClient(stack["store"], headers=token)

    async def replica(process: RolloutProcess) -> dict | None:
        assert process.process is not None and process.process.poll() is None, (
            process.log_path.read_text()[-3000:]
        )
        table = (await gateway.get("/v1/rollout/replicas")).json()["replicas"]
        return next((r for r in table if r["id"] == process.replica_id and r["ready"]), None)

    async def all_ready() -> bool:
        return all([await replica(p) for p in processes])

    async def all_holding() -> bool:
        held = [await replica(p) for p in processes]
        return all(
            r is not None and {"job_id": JOB, "number": 1, "kind": "lora"} in r["versions"]
            for r in held
        )

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

    async def served_blobs(process: RolloutProcess) -> int:
        async with httpx2.AsyncClient(base_url=process.url, timeout=30) as peer:
            return counted((await peer.get("/metrics")).text, PEER_BLOBS_ROUTE)

    try:
        for process in processes:
            process.start()
        await wait_for(all_ready, "three replicas ready", READY_TIMEOUT_S)
        adapter = lora_adapter(tiny_model_dir, tmp_path / "lora", seed=3, rank=8)
        version = await store.publish(
            VersionMeta(job_id=JOB, kind=VersionKind.lora, base_model=str(tiny_model_dir)), adapter
        )
        files = len(version.files)
        # Each pre-loads the publish as it hears of it: the three at once.
        await wait_for(all_holding, "the three replicas to report version 1", 120)
        from_store = counted((await store_metrics.get("/metrics")).text, STORE_FILES_ROUTE)
        assert from_store == files  # once, for the head of the chain
        from_peers = [await served_blobs(p) for p in processes]
        assert sum(from_peers) == 2 * files, from_peers  # the other two, from a replica
        assert sorted(from_peers) == [0, files, files], from_peers  # a chain, not a star
        for cache in stack["caches"]:
            copied = sorted(p.name for p in (cache / JOB / "1").iterdir())
            assert copied == sorted(Path(f.path).name for f in version.files)
        samples = [await sample_on(p) for p in processes]
        assert {s["version"] for s in samples} == {1}
        assert len({tuple(s["samples"][0]["token_ids"]) for s in samples}) == 1
    finally:
        await asyncio.gather(gateway.aclose(), store_metrics.aclose(), store.aclose())

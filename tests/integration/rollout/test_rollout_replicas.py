"""Two real rollout replicas (processes, each its own vLLM engine on its own core) behind the
real gateway: they register by heartbeat, load spreads over both, an affinity key sticks to
one, a replica killed without a word is routed around at once (no request fails) and leaves
the table within its heartbeats, and a replica stopped gracefully leaves at once. Tinker's and
Weaver's samples take the same routes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import numpy as np
import pytest

from gateway.app import create_app
from gateway.compat.tinker import wire
from gateway.settings import GatewaySettings
from services.common.ports import free_port
from tests.support.rollout_process import RolloutProcess
from tests.support.servers import serve_in_thread

PROMPT = [5, 6, 7, 8, 9]
PROTOBUF = "application/x-protobuf"  # Tinker's sampling results
READY_TIMEOUT_S = 400  # two engines starting at once on a shared 2-core machine


@dataclass
class Replicas:
    gateway: httpx2.AsyncClient
    processes: list[RolloutProcess]

    async def table(self) -> dict[str, dict]:
        response = await self.gateway.get("/v1/rollout/replicas")
        assert response.status_code == 200, response.text
        return {r["id"]: r for r in response.json()["replicas"]}

    async def routed(self) -> dict[str, int]:
        return {name: r["routed"] for name, r in (await self.table()).items()}

    async def all_ready(self) -> bool:
        for process in self.processes:
            assert process.process is not None and process.process.poll() is None, (
                process.log_path.read_text()[-3000:]
            )
        table = await self.table()
        return all(table.get(p.replica_id, {}).get("ready") for p in self.processes)

    async def sample(self, headers: dict[str, str] | None = None) -> dict:
        response = await self.gateway.post(
            "/v1/rollout/sample",
            headers=headers,
            json={"prompt_token_ids": PROMPT, "params": {"max_tokens": 4, "seed": 1}},
        )
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def stack(tiny_model_dir: Path, postgres_url: str, tmp_path: Path) -> Iterator[dict]:
    port = free_port()
    settings = GatewaySettings(
        data_dir=tmp_path / "data",
        database_url=postgres_url,
        gateway_url=f"http://127.0.0.1:{port}",
        rollout_url=f"http://127.0.0.1:{free_port()}",  # no static replica listens
        gateway_replica_missed_heartbeats=3,
    )
    with serve_in_thread(create_app(settings), port) as url:
        # Each engine on a core of its own, as `loom cluster` places replicas on one host.
        env = {
            "LOOM_DATABASE_URL": postgres_url,
            "LOOM_ROLLOUT_CPU_CORES_PER_REPLICA": "1",
            "LOOM_ROLLOUT_CPU_SLOTS_DIR": str(tmp_path / "core-slots"),
        }
        processes = [
            RolloutProcess(
                data_dir=settings.data_dir, model_dir=tiny_model_dir, gateway_url=url, env=env
            )
            for _ in range(2)
        ]
        try:
            for process in processes:
                process.start()
            yield {
                "url": url,
                "key": settings.admin_key_file.read_text().strip(),
                "processes": processes,
            }
        finally:
            for process in processes:
                process.stop()


async def wait_for(check, what: str, timeout_s: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.25)


async def test_two_replicas_share_load_stick_and_survive_a_kill(stack: dict) -> None:
    a, b = stack["processes"]
    async with httpx2.AsyncClient(
        base_url=stack["url"], timeout=120, headers={"Authorization": f"Bearer {stack['key']}"}
    ) as client:
        replicas = Replicas(client, [a, b])
        await wait_for(replicas.all_ready, "both replicas ready", READY_TIMEOUT_S)
        cores = [process.bound_cores() for process in (a, b)]
        assert all(cores) and not cores[0] & cores[1], cores  # no core shared
        table = await replicas.table()
        assert {r["url"] for r in table.values()} == {a.url, b.url}
        readiness = await client.get(
            "/v1/internal/rollout/readyz", headers={"Authorization": ""}
        )  # open, as every /readyz: the worker probes it
        assert readiness.status_code == 200 and readiness.json()["status"] == "ready"
        assert all(
            {"job_id": None, "number": 0, "kind": "base"} in r["versions"] for r in table.values()
        )

        # Load spreads: a burst lands on both.
        before = await replicas.routed()
        results = await asyncio.gather(*(replicas.sample() for _ in range(8)))
        after = await replicas.routed()
        assert all(
            r["samples"][0]["token_ids"] == results[0]["samples"][0]["token_ids"] for r in results
        )  # same weights, same seed: same tokens on either replica
        spread = {name: after[name] - before[name] for name in after}
        assert sum(spread.values()) == 8 and all(n > 0 for n in spread.values()), spread

        # An episode's turns stay on one replica.
        before = after
        for _ in range(4):
            await replicas.sample({"X-Loom-Affinity": "episode-7"})
        after = await replicas.routed()
        assert sorted(after[name] - before[name] for name in after) == [0, 4]

        # A replica killed without a word: requests keep succeeding, and it leaves the table.
        b.kill()
        await asyncio.gather(*(replicas.sample() for _ in range(6)))

        async def b_gone() -> bool:
            return set(await replicas.table()) == {a.replica_id}

        await wait_for(b_gone, "the killed replica to leave the table", 30)

        # A replica stopped gracefully says goodbye: the table falls back to the static URL.
        a.stop()
        table = await replicas.table()
        assert [r["static"] for r in table.values()] == [True], table
        response = await client.post("/v1/rollout/sample", json={"prompt_token_ids": PROMPT})
        assert response.status_code == 503, response.text  # the static URL: nothing listens
        assert (await client.get("/v1/internal/rollout/readyz")).status_code == 503


async def weaver_sample(client: httpx2.AsyncClient, sampler: str) -> list[int]:
    response = await client.post(
        f"/weaver/api/v1/sampling-sessions/{sampler}/samples",
        json={
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "sampling_params": {"max_tokens": 4, "seed": 1},
        },
    )
    assert response.status_code == 200, response.text
    operation = response.json()
    while operation["status"] == "pending":
        operation = (await client.get(f"/weaver/api/v1/operations/{operation['id']}")).json()
    assert operation["status"] == "done", operation
    return operation["response"]["sequences"][0]["tokens"]


async def tinker_sample(client: httpx2.AsyncClient, sampler: str) -> list[int]:
    response = await client.post(
        "/api/v1/asample",
        json={
            "sampling_session_id": sampler,
            "prompt": {"chunks": [{"tokens": PROMPT}]},
            "sampling_params": {"max_tokens": 4, "seed": 1},
        },
    )
    assert response.status_code == 200, response.text
    while True:
        result = await client.post(
            "/api/v1/retrieve_future", json={"request_id": response.json()["request_id"]}
        )
        assert result.status_code == 200, result.text
        if result.headers["content-type"] == PROTOBUF:  # the samples
            break
        assert result.json()["type"] == "try_again", result.text
    parsed = wire.SampleResponse.FromString(result.content)
    return np.frombuffer(parsed.sequences[0].tokens, dtype="<i4").tolist()


async def test_tinker_and_weaver_samples_are_routed_over_the_replicas(
    stack: dict, tiny_model_dir: Path
) -> None:
    """The SDK protocols sample through the same routing as /v1/rollout/*: a registered
    replica serves them (no static replica listens), and a replica SIGKILLed is routed
    around without a failed call."""
    a, b = stack["processes"]
    async with httpx2.AsyncClient(
        base_url=stack["url"], timeout=120, headers={"Authorization": f"Bearer {stack['key']}"}
    ) as client:
        replicas = Replicas(client, [a, b])
        await wait_for(replicas.all_ready, "both replicas ready", READY_TIMEOUT_S)
        weaver_session = (await client.post("/weaver/api/v1/sessions", json={})).json()["id"]
        weaver = await client.post(
            f"/weaver/api/v1/sessions/{weaver_session}/sampling-sessions",
            json={"sampling_session_seq_id": 0, "base_model": str(tiny_model_dir)},
        )
        assert weaver.status_code == 201, weaver.text
        tinker_session = (await client.post("/api/v1/create_session")).json()["session_id"]
        tinker = await client.post(
            "/api/v1/create_sampling_session",
            json={
                "session_id": tinker_session,
                "sampling_session_seq_id": 0,
                "base_model": str(tiny_model_dir),
            },
        )
        assert tinker.status_code == 200, tinker.text
        weaver_id, tinker_id = weaver.json()["id"], tinker.json()["sampling_session_id"]

        before = await replicas.routed()
        direct = (await replicas.sample())["samples"][0]["token_ids"]
        calls = 4
        sampled = await asyncio.gather(
            *(weaver_sample(client, weaver_id) for _ in range(calls)),
            *(tinker_sample(client, tinker_id) for _ in range(calls)),
        )
        assert all(tokens == direct for tokens in sampled)  # same seed, same base model
        after = await replicas.routed()
        assert sum(after.values()) - sum(before.values()) == 2 * calls + 1, (before, after)

        b.kill()  # without a word: the table still names it until its heartbeats run out
        sampled = await asyncio.gather(
            *(weaver_sample(client, weaver_id) for _ in range(calls)),
            *(tinker_sample(client, tinker_id) for _ in range(calls)),
        )
        assert all(tokens == direct for tokens in sampled)

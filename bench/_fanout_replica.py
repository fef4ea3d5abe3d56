"""A files-only rollout replica for bench/fanout.py: the rollout service's own fan-out parts
(`Fetcher` with its gateway claims, the blob route peers fetch from, the heartbeat) without a
vLLM engine, so that many fit on this machine and the file distribution is timed apart from
engine loading. It follows the store's publications as the rollout service does and fetches
each version on hearing of it; when a version's files are verified in its cache it appends
`{"job_id", "number", "done_at", "bytes_from_peers", "bytes_from_store"}` to
LOOM_BENCH_DONE_LOG. It follows only the versions of LOOM_BENCH_JOB.

    LOOM_ROLLOUT_URL=... LOOM_GATEWAY_URL=... LOOM_MODELSTATE_URL=... LOOM_DATA_DIR=...
    LOOM_BENCH_DONE_LOG=... LOOM_BENCH_JOB=... LOOM_BENCH_PEERS=chain|store \
        python -m bench._fanout_replica
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
from fastapi import FastAPI

from modelstate.client import ModelStateClient
from modelstate.schemas import Version
from services.common.app_factory import create_service_app
from services.common.http import DEFAULT_TIMEOUT
from services.common.serve import serve
from services.common.service_token import client_of, service_headers, service_token
from services.rollout import routes
from services.rollout.announce import Announcer
from services.rollout.fanout import Fetcher, GatewayPeers
from services.rollout.gateway_calls import GatewayReplicas
from services.rollout.schemas import LoadedVersion, ReplicaHeartbeat
from services.rollout.settings import RolloutSettings


class StoreOnly:
    """The baseline arm: no peers, every replica fetches from the store."""

    async def sources(self, job_id: str, number: int) -> list[str]:
        return []


def create_app(settings: RolloutSettings, job_id: str, done_log: Path, chain: bool) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = ModelStateClient.from_settings(settings)
        gateway = client_of(settings, GatewayReplicas, retries=0)
        http = httpx2.AsyncClient(headers=service_headers(settings), timeout=DEFAULT_TIMEOUT)
        peers = GatewayPeers(gateway, settings.replica_id) if chain else StoreOnly()
        fetcher = Fetcher(store, peers, http, settings.cache_dir, in_place=False)
        app.state.held_files = fetcher.held
        held: list[LoadedVersion] = []

        def heartbeat() -> ReplicaHeartbeat:
            return ReplicaHeartbeat(
                url=settings.url_of("rollout"),
                ready=True,
                versions=held,
                heartbeat_s=settings.rollout_heartbeat_s,
            )

        async def fetch(version: Version) -> None:
            await fetcher.materialize(version)
            done_at = time.time()
            held.append(LoadedVersion(job_id=version.job_id, number=version.number, kind="full"))
            with done_log.open("a") as out:
                record = {
                    "job_id": version.job_id,
                    "number": version.number,
                    "done_at": done_at,
                    "bytes_from_peers": fetcher.counts.bytes_from_peers,
                    "bytes_from_store": fetcher.counts.bytes_from_store,
                }
                out.write(json.dumps(record) + "\n")

        async def follow() -> None:
            async for event in store.subscribe_events(job_id):
                if isinstance(event, Version):
                    await fetch(event)

        announcer = Announcer(gateway, settings.replica_id, settings.rollout_heartbeat_s, heartbeat)
        await announcer.beat()  # registered before the bench publishes
        tasks = [asyncio.create_task(announcer.run()), asyncio.create_task(follow())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await announcer.leave()
            await asyncio.gather(store.aclose(), gateway.aclose(), http.aclose())

    return create_service_app(
        "rollout",
        routers=[routes.router],
        lifespan=lifespan,
        service_token=service_token(settings),
    )


def main() -> None:
    settings = RolloutSettings()
    done_log = Path(os.environ["LOOM_BENCH_DONE_LOG"])
    chain = os.environ.get("LOOM_BENCH_PEERS", "chain") == "chain"
    job_id = os.environ["LOOM_BENCH_JOB"]
    serve("rollout", lambda: create_app(settings, job_id, done_log, chain), settings)


if __name__ == "__main__":
    main()

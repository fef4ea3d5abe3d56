"""The trainer's FastAPI app: long-lived objects built in the lifespan, routes in routes.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from modelstate.client import ModelStateClient
from services.common.app_factory import create_service_app
from services.common.busy import BusyClock
from services.common.operations import OperationQueue
from services.common.service_token import service_token
from services.trainer.distributed import channel
from services.trainer.distributed.commands import RankConfig
from services.trainer.distributed.ranks import RankGroup
from services.trainer.distributed.remote import RemoteRegistry
from services.trainer.distributed.sharding import Sharding
from services.trainer.model import resolve_device
from services.trainer.publish import ThreadPublisher
from services.trainer.registry import ModelRegistry
from services.trainer.routes import router
from services.trainer.service import TrainerService
from services.trainer.settings import CPU_OFFLOAD_NEEDS_GPU, TrainerSettings


def create_app(
    settings: TrainerSettings | None = None, *, modelstate: ModelStateClient | None = None
) -> FastAPI:
    """`modelstate`: a client to publish through (tests pass one bound to an in-process
    store); by default one is built for `settings.modelstate_url` and closed at shutdown."""
    settings = settings or TrainerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.trainer_threads:
            torch.set_num_threads(settings.trainer_threads)
        device = resolve_device(settings.trainer_device)
        if settings.trainer_cpu_offload and device.type != "cuda":  # 'auto' found no GPU
            raise ValueError(CPU_OFFLOAD_NEEDS_GPU)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = settings.trainer_tf32
        client = modelstate or ModelStateClient.from_settings(settings)
        queue = OperationQueue(busy=busy)
        group = rank_group(settings) if settings.sharded else None
        if group is not None:
            await asyncio.to_thread(group.start)
        app.state.trainer = TrainerService(
            ModelRegistry(settings.data_dir, device, settings.trainer_micro_batch_tokens)
            if group is None
            else RemoteRegistry(group),
            queue,
            ThreadPublisher(client, asyncio.get_running_loop()),
            settings.trainer_work_dir,
            shard_bytes=settings.trainer_shard_mb << 20,
            checkpoint_dir=settings.trainer_checkpoint_dir,
            # The ranks write the weight files themselves: no reserve to write them over.
            page_reserve_bytes=settings.trainer_page_reserve_mb << 20 if group is None else 0,
            max_request_tokens=settings.trainer_max_request_tokens,
            keep_series_checkpoints=settings.trainer_keep_series_checkpoints,
        )
        app.state.trainer.release_page_reserves()
        try:
            yield
        finally:
            queue.shutdown()
            if group is not None:
                await asyncio.to_thread(group.stop)
            app.state.trainer.release_page_reserves()
            if modelstate is None:
                await client.aclose()

    app = create_service_app(
        "trainer", routers=[router], lifespan=lifespan, service_token=service_token(settings)
    )
    busy = BusyClock(
        "loom_trainer_busy_seconds",
        "Seconds the trainer spent running operations (its device busy)",
    )
    app.state.metrics_registry.register(busy)
    return app


def rank_group(settings: TrainerSettings) -> RankGroup:
    """The ranks of a sharded trainer (`LOOM_TRAINER_WORLD_SIZE` > 1), not started yet; on
    several hosts (`LOOM_TRAINER_NNODES` > 1) listening for the other hosts' ranks already."""
    master_addr, master_port = "127.0.0.1", 0
    listener = None
    if settings.trainer_nnodes > 1:
        assert settings.trainer_rendezvous and settings.trainer_coordinator  # validated
        master_addr, master_port = channel.parse_address(settings.trainer_rendezvous)
        listener = channel.RankListener(
            channel.parse_address(settings.trainer_coordinator),
            channel.authkey(service_token(settings)),
            range(settings.ranks_of_node(0).stop, settings.trainer_world_size),
        )
    config = RankConfig(
        world_size=settings.trainer_world_size,
        master_port=master_port,
        data_dir=settings.data_dir,
        device=settings.trainer_device,
        micro_batch_tokens=settings.trainer_micro_batch_tokens,
        threads=settings.trainer_threads,
        sharding=Sharding(
            settings.trainer_precision,
            settings.trainer_activation_checkpointing,
            settings.trainer_cpu_offload,
        ),
        timeout_s=settings.trainer_collective_timeout_s,
        master_addr=master_addr,
    )
    return RankGroup(config, listener)

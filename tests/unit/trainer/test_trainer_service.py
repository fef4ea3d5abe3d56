"""The registry and the per-model operation order, without HTTP (the tiny model on CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from modelstate.client import ModelStateClient
from services.common.errors import Conflict, NotFound, PayloadTooLarge
from services.common.operations import OperationQueue
from services.trainer.publish import ThreadPublisher
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    CreateModelRequest,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    OptimStepRequest,
    TrainingMode,
)
from services.trainer.service import TrainerService


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[TrainerService]:
    queue = OperationQueue()
    # Never reached here: nothing in these tests publishes.
    client = ModelStateClient("http://127.0.0.1:9")
    yield TrainerService(
        ModelRegistry(tmp_path, torch.device("cpu")),
        queue,
        ThreadPublisher(client, asyncio.get_running_loop()),
        tmp_path / "work",
    )
    queue.shutdown()
    await client.aclose()


def spec(tiny_model_dir: Path, **changes: object) -> CreateModelRequest:
    return CreateModelRequest.model_validate(
        {"job_id": "j1", "base_model": str(tiny_model_dir), **changes}
    )


def test_create_is_idempotent_and_conflicts_on_a_different_config(
    service: TrainerService, tiny_model_dir: Path
) -> None:
    info, created = service.create_model(spec(tiny_model_dir))
    assert created and info.mode == TrainingMode.lora and info.lora == LoraConfig()
    again, created_again = service.create_model(spec(tiny_model_dir))
    assert not created_again and again == info
    with pytest.raises(Conflict, match="different configuration"):
        service.create_model(spec(tiny_model_dir, lora={"rank": 4}))
    with pytest.raises(NotFound, match="'j2'"):
        service.model_info("j2")


def test_full_mode_ignores_lora_settings_when_comparing(
    service: TrainerService, tiny_model_dir: Path
) -> None:
    service.create_model(spec(tiny_model_dir, mode="full"))
    _, created = service.create_model(spec(tiny_model_dir, mode="full", lora={"rank": 4}))
    assert not created


async def test_operations_of_a_model_run_in_submission_order(
    service: TrainerService, tiny_model_dir: Path
) -> None:
    service.create_model(spec(tiny_model_dir))
    data = [Datum(input_ids=[3, 4, 5, 6], loss_mask=[0, 1, 1, 1])]
    ops = []
    for _ in range(3):
        ops.append(service.forward_backward("j1", ForwardBackwardRequest(data=data)))
        ops.append(service.optim_step("j1", OptimStepRequest()))
    ops.append(service.forward("j1", ForwardRequest(data=data)))
    done = [await service.operation(op.id, wait=60) for op in ops]
    assert all(op.status == "succeeded" for op in done), [op.error for op in done]
    assert [op.result["step"] for op in done[1:6:2]] == [1, 2, 3]
    for earlier, later in zip(done, done[1:], strict=False):
        assert earlier.finished_at is not None and later.started_at is not None
        assert earlier.finished_at <= later.started_at
    assert service.model_info("j1").step == 3


async def test_a_request_past_the_token_limit_is_refused_naming_the_setting(
    service: TrainerService, tiny_model_dir: Path
) -> None:
    service.create_model(spec(tiny_model_dir))
    service.max_request_tokens = 100
    # 4 rows padded to the longest (30): 120 tokens, though only 57 are real.
    data = [Datum(input_ids=[5] * n, loss_mask=[1.0] * n) for n in (30, 9, 9, 9)]
    for submit in (
        lambda: service.forward_backward("j1", ForwardBackwardRequest(data=data)),
        lambda: service.forward("j1", ForwardRequest(data=data)),
    ):
        with pytest.raises(PayloadTooLarge, match="LOOM_TRAINER_MAX_REQUEST_TOKENS") as refused:
            submit()
        assert refused.value.detail == {"padded_tokens": 120, "limit": 100}
    accepted = service.forward_backward("j1", ForwardBackwardRequest(data=data[1:]))
    done = await service.operation(accepted.id, wait=60)
    assert done.status == "succeeded", done.error

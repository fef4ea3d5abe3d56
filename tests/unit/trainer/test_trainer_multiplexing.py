"""Several jobs on one trainer: LoRA jobs share one copy of their base, each trains only its
own adapter, operations of different jobs take turns, and one job's failure stops no other."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from modelstate.client import ModelStateClient
from services.common.errors import InvalidInput
from services.common.operations import OperationQueue
from services.trainer.publish import ThreadPublisher
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    OptimStepRequest,
)
from services.trainer.service import TrainerService

DATA = [Datum(input_ids=[3, 4, 5, 6, 7], loss_mask=[0, 1, 1, 1, 1])]
STEP = OptimStepRequest(adam=AdamParams(lr=5e-2))


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[TrainerService]:
    queue = OperationQueue()
    client = ModelStateClient("http://127.0.0.1:9")  # never reached: nothing publishes
    yield TrainerService(
        ModelRegistry(tmp_path, torch.device("cpu")),
        queue,
        ThreadPublisher(client, asyncio.get_running_loop()),
        tmp_path / "work",
    )
    queue.shutdown()
    await client.aclose()


def create(service: TrainerService, job: str, base: Path, **changes: object) -> None:
    service.create_model(
        CreateModelRequest.model_validate(
            {"job_id": job, "base_model": str(base), "lora": {"rank": 4}, **changes}
        )
    )


async def train(service: TrainerService, job: str, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        trained = service.forward_backward(job, ForwardBackwardRequest(data=DATA))
        service.optim_step(job, STEP)
        done = await service.operation(trained.id, wait=60)
        assert done.status == "succeeded", done.error
        losses.append(done.result["loss"])
    return losses


async def logprobs(service: TrainerService, job: str) -> list[float]:
    done = await service.operation(service.forward(job, ForwardRequest(data=DATA)).id, wait=60)
    return list(done.result["logprobs"][0])


async def test_lora_jobs_share_one_base_and_train_only_their_adapter(
    service: TrainerService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    create(service, "job_solo", tiny_model_dir, seed=1)
    alone = await train(service, "job_solo", 3)

    create(service, "job_a", tiny_model_dir, seed=1)
    create(service, "job_b", tiny_model_dir, seed=2, lora={"rank": 8, "alpha": 16})
    a, b = service.registry.get("job_a"), service.registry.get("job_b")
    assert a._host is b._host and len(service.registry._lora_hosts) == 1
    assert not {id(p) for p in a.params} & {id(p) for p in b.params}
    assert a.info().num_params == a._host.base_params + sum(p.numel() for p in a.params)

    b_before = await logprobs(service, "job_b")
    # Interleaved with b's training, a learns exactly as it did alone (same seed, same data).
    a_losses, _ = await asyncio.gather(train(service, "job_a", 3), train(service, "job_b", 3))
    assert a_losses == pytest.approx(alone, rel=1e-5)
    assert await logprobs(service, "job_b") != pytest.approx(b_before)

    solo_after = await logprobs(service, "job_solo")
    assert await logprobs(service, "job_a") == pytest.approx(solo_after, rel=1e-5)

    # Each save is a plain single-adapter PEFT directory that loads into a fresh base.
    for job, rank in (("job_a", 4), ("job_b", 8)):
        out = tmp_path / f"adapter-{job}"
        out.mkdir()
        service.registry.get(job).save(out, shard_bytes=1 << 30)
        assert json.loads((out / "adapter_config.json").read_text())["r"] == rank
        saved = load_file(out / "adapter_model.safetensors")
        assert saved and all(job not in name for name in saved)
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
        loaded = peft.PeftModel.from_pretrained(base, str(out)).eval()
        with torch.no_grad():
            logits = loaded(input_ids=torch.tensor([DATA[0].input_ids])).logits
        ids = torch.tensor(DATA[0].input_ids[1:])
        expected = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[:, None])[:, 0]
        assert expected.tolist() == pytest.approx((await logprobs(service, job))[1:], abs=1e-4)


async def test_operations_of_different_jobs_take_turns() -> None:
    queue = OperationQueue()
    order: list[str] = []

    def op(name: str) -> dict[str, str]:
        order.append(name)
        return {}

    greedy = [queue.submit("greedy", "x", lambda i=i: op(f"g{i}")) for i in range(6)]
    polite = queue.submit("polite", "x", lambda: op("p0"))
    for submitted in (*greedy, polite):
        await queue.wait(submitted.id, 10)
    queue.shutdown()
    # The second job waits for at most one operation of the first, not for its whole queue.
    assert order.index("p0") <= 2, order


async def test_one_jobs_failure_stops_no_other(
    service: TrainerService, tiny_model_dir: Path
) -> None:
    create(service, "ok", tiny_model_dir)
    create(service, "broken", tiny_model_dir)
    with pytest.raises(InvalidInput):
        create(service, "bad-targets", tiny_model_dir, lora={"target_modules": ["nope_proj"]})
    failed = service.optim_step("broken", STEP)  # no gradients yet: fails when it runs
    losses = await train(service, "ok", 2)
    outcome = await service.operation(failed.id, wait=60)
    assert outcome.status == "failed" and "No gradients" in outcome.error.message
    assert len(losses) == 2 and losses[1] < losses[0]
    assert await train(service, "broken", 1)  # the failed job itself carries on too

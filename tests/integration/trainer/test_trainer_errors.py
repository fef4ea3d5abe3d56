"""Malformed requests get a clear 4xx; operations that cannot run fail with a clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_harness import JOB_LORA, TrainerHarness, serving

from modelstate.client import ModelStateClient
from services.trainer.settings import TrainerSettings

GOOD = {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}


def error_of(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"data": [{"input_ids": [1, 2, 3], "loss_mask": [0, 1]}]}, "loss_mask has 2 entries"),
        ({"data": [GOOD], "loss": {"name": "dpo"}}, "loss.name"),
        ({"data": [GOOD], "loss": {"name": "ppo"}}, "needs advantages and logprobs"),
        (
            {"data": [{"input_ids": [1, 271], "loss_mask": [0, 1]}]},
            "token id 271 is outside the model's vocabulary (size 271",
        ),
        ({"data": [{"input_ids": [1, -2], "loss_mask": [0, 1]}]}, "non-negative token ids"),
        ({"data": [{"input_ids": [1, 2], "loss_mask": [1, 0]}]}, "No token carries loss"),
        ({"data": [{"input_ids": [1] * 513, "loss_mask": [1] * 513}]}, "maximum length of 512"),
        ({"data": []}, "data"),
        ({"data": [GOOD], "surprise": 1}, "surprise"),
    ],
)
async def test_bad_forward_backward_is_rejected(
    trainer: TrainerHarness, body: dict[str, Any], expected: str
) -> None:
    await trainer.create(JOB_LORA, "lora")
    response = await trainer.http.post(f"/v1/models/{JOB_LORA}/forward_backward", json=body)
    assert expected in error_of(response, 422)


async def test_bad_forward_and_optim_step_are_rejected(trainer: TrainerHarness) -> None:
    await trainer.create(JOB_LORA, "lora")
    too_big = {"data": [{"input_ids": [300, 1], "loss_mask": [0, 0]}]}
    response = await trainer.http.post(f"/v1/models/{JOB_LORA}/forward", json=too_big)
    assert "token id 300" in error_of(response, 422)
    response = await trainer.http.post(
        f"/v1/models/{JOB_LORA}/optim_step", json={"adam": {"lr": -1}}
    )
    assert "adam.lr" in error_of(response, 422)
    response = await trainer.http.post(
        f"/v1/models/{JOB_LORA}/save_weights", json={"aliases": ["has space"]}
    )
    assert "aliases" in error_of(response, 422)


async def test_unknown_model_and_operation_are_404(trainer: TrainerHarness) -> None:
    for method, path in [
        ("GET", "/v1/models/nope"),
        ("POST", "/v1/models/nope/optim_step"),
        ("POST", "/v1/models/nope/save_weights"),
        ("GET", "/v1/operations/op_missing"),
    ]:
        response = await trainer.http.request(method, path, json={})
        assert "nope" in error_of(response, 404) or "op_missing" in response.text
    response = await trainer.http.post("/v1/models/nope/forward_backward", json={"data": [GOOD]})
    assert "create it with POST /v1/models" in error_of(response, 404)


async def test_operation_wait_is_bounded(trainer: TrainerHarness) -> None:
    response = await trainer.http.get("/v1/operations/op_x", params={"wait": 61})
    assert "wait" in error_of(response, 422)


async def test_bad_create_requests(trainer: TrainerHarness) -> None:
    missing = await trainer.http.post(
        "/v1/models", json={"job_id": "j", "base_model": "/no/such/dir", "mode": "full"}
    )
    assert "does not exist" in error_of(missing, 422)
    targets = await trainer.http.post(
        "/v1/models",
        json={
            "job_id": "j",
            "base_model": trainer.base_model,
            "lora": {"target_modules": ["nope"]},
        },
    )
    assert "nope" in error_of(targets, 422)
    bad_id = await trainer.http.post(
        "/v1/models", json={"job_id": "has space", "base_model": trainer.base_model}
    )
    assert "job_id" in error_of(bad_id, 422)


async def test_optim_step_without_gradients_fails_clearly(trainer: TrainerHarness) -> None:
    await trainer.create(JOB_LORA, "lora")
    op = await trainer.wait((await trainer.submit(JOB_LORA, "optim_step", {}))["id"])
    assert op["status"] == "failed"
    assert op["error"]["code"] == "conflict"
    assert "call forward_backward before optim_step" in op["error"]["message"]


async def test_save_weights_reports_an_unreachable_store(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    client = ModelStateClient("http://127.0.0.1:9")  # the discard port: nothing listens
    settings = TrainerSettings(data_dir=tmp_path, trainer_device="cpu")
    async with serving(settings, client, tiny_model_dir) as trainer:
        await trainer.create(JOB_LORA, "lora")
        op = await trainer.wait((await trainer.submit(JOB_LORA, "save_weights", {}))["id"])
    await client.aclose()
    assert op["status"] == "failed" and op["error"]["code"] == "unavailable"
    assert "modelstate is unreachable" in op["error"]["message"]
    assert not (tmp_path / "trainer").exists()  # it failed before writing anything

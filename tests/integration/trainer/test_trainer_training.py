"""Real training through the HTTP API: the tiny model, full and LoRA, on CPU."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from trainer_harness import JOB_FULL, JOB_LORA, TrainerHarness

LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}


async def test_create_full_and_lora_models(trainer: TrainerHarness) -> None:
    full = await trainer.create(JOB_FULL, "full")
    lora = await trainer.create(JOB_LORA, "lora", lora=LORA)
    assert full["trainable_params"] == full["num_params"] and full["lora"] is None
    assert 0 < lora["trainable_params"] < lora["num_params"]
    assert lora["lora"]["rank"] == 8 and lora["step"] == 0 and lora["last_version"] == 0

    again = await trainer.http.post(
        "/v1/models",
        json={"job_id": JOB_LORA, "base_model": trainer.base_model, "mode": "lora", "lora": LORA},
    )
    assert again.status_code == 200 and again.json() == lora  # identical request: no-op
    other = await trainer.http.post(
        "/v1/models", json={"job_id": JOB_LORA, "base_model": trainer.base_model, "mode": "full"}
    )
    assert other.status_code == 409
    assert "different configuration" in other.json()["error"]["message"]

    fetched = await trainer.http.get(f"/v1/models/{JOB_FULL}")
    assert fetched.status_code == 200 and fetched.json() == full


@pytest.mark.parametrize(("mode", "lr"), [("full", 3e-3), ("lora", 1e-2)])
async def test_sft_lowers_the_loss(
    trainer: TrainerHarness, arithmetic_data: list[dict[str, Any]], mode: str, lr: float
) -> None:
    await trainer.create("sft", mode)
    adam = {"lr": lr, "grad_clip": None if mode == "full" else 1.0}  # both norm paths
    losses = []
    for step in range(1, 9):
        result = await trainer.run("sft", "forward_backward", {"data": arithmetic_data})
        losses.append(result["loss"])
        stepped = await trainer.run("sft", "optim_step", {"adam": adam})
        assert stepped["step"] == step and stepped["grad_norm"] > 0
    answer_tokens = sum(sum(d["loss_mask"][1:]) for d in arithmetic_data)
    assert result["num_tokens"] == answer_tokens
    assert losses[-1] < losses[0] - 0.5, losses  # same data each step: no noise
    info = (await trainer.http.get("/v1/models/sft")).json()
    assert info["step"] == 8


async def test_ppo_with_advantages_and_kl(
    trainer: TrainerHarness, arithmetic_data: list[dict[str, Any]]
) -> None:
    await trainer.create(JOB_LORA, "lora", lora=LORA)
    sampled = await trainer.run(JOB_LORA, "forward", {"data": arithmetic_data})
    data = [
        {**d, "logprobs": lp, "advantages": [1.0 if i % 2 else -1.0] * len(lp)}
        for i, (d, lp) in enumerate(zip(arithmetic_data, sampled["logprobs"], strict=True))
    ]
    assert [len(lp) for lp in sampled["logprobs"]] == [len(d["input_ids"]) for d in data]
    loss = {"name": "ppo", "clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.1}

    on_policy = await trainer.run(JOB_LORA, "forward_backward", {"data": data, "loss": loss})
    # Same weights as the sampler, and a fresh adapter is the reference model itself.
    assert on_policy["metrics"]["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert on_policy["metrics"]["clip_fraction"] == 0.0
    assert on_policy["metrics"]["kl"] == pytest.approx(0.0, abs=1e-6)
    await trainer.run(JOB_LORA, "optim_step", {"adam": {"lr": 5e-2}})

    moved = await trainer.run(JOB_LORA, "forward_backward", {"data": data, "loss": loss})
    assert moved["metrics"]["ratio_mean"] != pytest.approx(1.0, abs=1e-5)
    assert moved["metrics"]["kl"] > 0
    assert moved["loss"] == pytest.approx(
        moved["metrics"]["policy_loss"] + 0.1 * moved["metrics"]["kl"], rel=1e-5
    )


async def test_full_model_kl_uses_a_frozen_base(
    trainer: TrainerHarness, arithmetic_data: list[dict[str, Any]]
) -> None:
    await trainer.create(JOB_FULL, "full")
    loss = {"name": "cross_entropy", "kl_coef": 1.0}
    first = await trainer.run(JOB_FULL, "forward_backward", {"data": arithmetic_data, "loss": loss})
    assert first["metrics"]["kl"] == pytest.approx(0.0, abs=1e-6)
    await trainer.run(JOB_FULL, "optim_step", {"adam": {"lr": 1e-2}})
    second = await trainer.run(
        JOB_FULL, "forward_backward", {"data": arithmetic_data, "loss": loss}
    )
    assert second["metrics"]["kl"] > 0


async def test_operations_execute_in_submission_order(
    trainer: TrainerHarness, arithmetic_data: list[dict[str, Any]]
) -> None:
    await trainer.create(JOB_LORA, "lora", lora=LORA)
    batch = {"data": arithmetic_data[:4]}
    actions = [
        ("forward_backward", batch),
        ("optim_step", {}),
        ("forward", batch),
        ("forward_backward", batch),
        ("optim_step", {}),
        ("forward", batch),
    ]
    submitted = [await trainer.submit(JOB_LORA, action, body) for action, body in actions]
    done = [await trainer.wait(op["id"]) for op in submitted]
    assert [op["status"] for op in done] == ["succeeded"] * len(actions)
    assert [op["kind"] for op in done] == [action for action, _ in actions]
    starts = [datetime.fromisoformat(op["started_at"]) for op in done]
    finishes = [datetime.fromisoformat(op["finished_at"]) for op in done]
    assert all(finishes[i] <= starts[i + 1] for i in range(len(done) - 1))
    assert [done[1]["result"]["step"], done[4]["result"]["step"]] == [1, 2]
    # The forward after step 1 and the one after step 2 see different weights.
    assert done[2]["result"]["logprobs"] != done[5]["result"]["logprobs"]


@pytest.mark.parametrize(
    "loss",
    [
        {"name": "cispo"},
        {"name": "dro", "dro_beta": 0.1},
        {"name": "reinforce"},
        {"name": "ppo", "kl_coef": 0.1},
    ],
)
async def test_forward_reports_the_loss_forward_backward_computes_and_its_logprobs(
    trainer: TrainerHarness, arithmetic_data: list[dict[str, Any]], loss: dict[str, Any]
) -> None:
    """One trainer call per SDK pass: forward gives a loss's value without a gradient, and
    forward_backward returns the logprobs its own forward computed."""
    await trainer.create(JOB_LORA, "lora", lora=LORA)
    plain = await trainer.run(JOB_LORA, "forward", {"data": arithmetic_data})
    assert plain["loss"] is None
    data = [
        {
            **d,
            "logprobs": [lp - 0.3 * (i % 3) for i, lp in enumerate(row)],
            "advantages": [1.0 if n % 2 else -0.5] * len(row),
        }
        for n, (d, row) in enumerate(zip(arithmetic_data, plain["logprobs"], strict=True))
    ]
    if loss["name"] == "reinforce":  # the only loss that reads no sampler logprobs
        data = [{k: v for k, v in d.items() if k != "logprobs"} for d in data]
    valued = await trainer.run(JOB_LORA, "forward", {"data": data, "loss": loss})
    trained = await trainer.run(
        JOB_LORA, "forward_backward", {"data": data, "loss": loss, "return_logprobs": True}
    )
    assert valued["loss"] == pytest.approx(trained["loss"], rel=1e-5)
    for row, again, back in zip(
        plain["logprobs"], valued["logprobs"], trained["logprobs"], strict=True
    ):
        assert again == pytest.approx(row, abs=1e-5) and back == pytest.approx(row, abs=1e-5)
    stepped = await trainer.run(JOB_LORA, "optim_step", {"adam": {"lr": 1e-2}})
    assert stepped["grad_norm"] > 0
    without = await trainer.run(JOB_LORA, "forward_backward", {"data": data, "loss": loss})
    assert without["logprobs"] is None


async def test_a_forward_loss_over_no_loss_tokens_is_zero(
    trainer: TrainerHarness, arithmetic_data: list[dict[str, Any]]
) -> None:
    await trainer.create(JOB_LORA, "lora", lora=LORA)
    silent = [{**d, "loss_mask": [0.0] * len(d["loss_mask"])} for d in arithmetic_data]
    valued = await trainer.run(JOB_LORA, "forward", {"data": silent, "loss": {}})
    assert valued["loss"] == 0.0

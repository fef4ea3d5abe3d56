"""Managed runs on the real stack (`loom up`'s worker, vLLM rollout, reward, trainer): the demo
as the `arith_grpo` recipe, and `loom run` driving the `sft` recipe on texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.sdk import LoomClient
from cli.main import app
from services.worker.task_schemas import TaskStatus

pytestmark = pytest.mark.e2e


def test_the_demo_runs_as_a_managed_recipe(stack: tuple[str, str, Path]) -> None:
    url, key, _ = stack
    config = {
        "held_out": 16,
        "validation": 16,
        "sft_min_steps": 10,
        "sft_max_steps": 20,
        "sft_check_every": 10,
        "sft_target_accuracy": 0.0,
        "rl_steps": 3,
        "prompts_per_step": 8,
        "group_size": 4,
        "eval_every": 3,
    }
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="managed-arith", mode="full")
        task = job.run_recipe("arith_grpo", config)
        info = task.wait(timeout=900)
        assert info.status is TaskStatus.succeeded, info.error
        summary = info.result["summary"]
        assert summary["sft_steps"] == 10  # the first check decides (target 0)
        assert job.version("sft").number == summary["sft_version"]
        assert job.version("best").number == summary["best_version"]
        assert 0.0 <= summary["held_out_accuracy_best"] <= 1.0
        assert info.progress is not None and info.progress.step == 13
        rewards = job.metrics(["rl/reward"])["rl/reward"]
        assert rewards.steps == [1, 2, 3]  # RL counts its own steps (sft/ has 1-10)
        assert job.metrics(["sft/loss"])["sft/loss"].steps == list(range(1, 11))
        assert len(job.samples()) == 3 * 8
        assert loom.get_job(job.id).info.status.value == "completed"


def test_loom_run_follows_an_sft_run_to_its_summary(
    stack: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, key, _ = stack
    config = tmp_path / "sft.json"
    config.write_text(
        json.dumps(
            {
                "examples": [
                    {"prompt": "12+7=", "completion": "19<|endoftext|>"},
                    {"prompt": "3+4=", "completion": "7<|endoftext|>"},
                ],
                "steps": 4,
                "checkpoint_every": 2,
                "batch_size": 2,
                "adam": {"lr": 0.01},
            }
        )
    )
    result = CliRunner().invoke(
        app,
        [
            "run",
            "sft",
            "--config",
            f"@{config}",
            "--url",
            url,
            "--api-key",
            key,
            "--name",
            "cli-sft",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output
    assert '"final_loss"' in result.output

    refused = CliRunner().invoke(
        app, ["run", "sft", "--config", '{"steps": 1}', "--url", url, "--api-key", key]
    )
    assert refused.exit_code == 1
    assert "either `examples`" in refused.output

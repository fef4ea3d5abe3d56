"""Background tasks on the real stack (`loom up`'s worker, embedded filesystem broker): a LoRA
version evaluated on a held-out set through rollout and reward, the accuracy logged as job
metrics at the version's step, then the version exported merged into a full model."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from agents.algorithms import sft_datum
from agents.sdk import AdamParams, LoomClient

pytestmark = pytest.mark.e2e


def test_evaluate_then_export_a_lora_version(stack: tuple[str, str, Path]) -> None:
    url, key, data_dir = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="tasks", mode="lora")
        prompt, answer = loom.tokenize(["12+7=", "19<|endoftext|>"])
        for _ in range(3):
            job.forward_backward([sft_datum(prompt, answer)])
            job.optim_step(AdamParams(lr=1e-2))
        version = job.save_weights().result().number

        items = [{"prompt": "12+7=", "reference": "19"}, {"prompt": "3+4=", "reference": "7"}]
        evaluation = job.submit_task(
            "evaluate",
            {
                "name": "e2e",
                "version": version,
                "verifier": "exact_match",
                "items": items,
                "sampling": {"max_tokens": 4, "temperature": 0},
            },
        ).result(timeout=300)
        assert (evaluation.version, evaluation.count, evaluation.errors) == (version, 2, 0)
        assert evaluation.accuracy in (0.0, 0.5, 1.0)
        accuracy = job.metrics(["eval/e2e/accuracy"])["eval/e2e/accuracy"]
        assert (accuracy.steps, accuracy.values) == ([evaluation.step], [evaluation.accuracy])

        export = job.submit_task("export", {"version": version}).result(timeout=300)
        assert Path(export.path) == data_dir / "exports" / job.id / str(version)
        assert "model.safetensors" in {f.path for f in export.files}
        assert AutoConfig.from_pretrained(export.path).hidden_size > 0

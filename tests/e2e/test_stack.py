"""End to end on the real local stack, through the gateway and the SDK: a publish is served by
rollout (full and LoRA), bad input gets clear 4xx, and the demo job learns."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM

from agents.algorithms import sft_datum
from agents.examples.arith_grpo import DemoConfig, run_demo
from agents.sdk import (
    AdamParams,
    Conflict,
    InvalidInput,
    LoomClient,
    NotFound,
    SamplingParams,
    ScoreItem,
)

pytestmark = pytest.mark.e2e
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_samples_after_publish_carry_the_new_version(stack, mode: str) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name=f"handoff-{mode}", mode=mode)
        before = job.sample("12+7=", params=SamplingParams(max_tokens=4, temperature=0))
        assert before.version == 0  # nothing published yet: the base model

        prompt, answer = loom.tokenize(["12+7=", "19<|endoftext|>"])
        for _ in range(3):
            job.forward_backward([sft_datum(prompt, answer)])
            job.optim_step(AdamParams(lr=1e-2))
        saved = job.save_weights().result()
        assert saved.number == 1 and saved.kind == mode

        after = job.sample("12+7=", params=SamplingParams(max_tokens=4, temperature=0))
        assert after.version == saved.number
        assert all(s.version == saved.number for s in after.samples)
        # Different weights, different logprobs for the same greedy prefix.
        assert after.samples[0].logprobs != before.samples[0].logprobs

        # The engine serves exactly the trainer's weights: same logprobs for the same tokens
        # (this catches a reload that leaves any layer, e.g. a tied LM head, on old weights).
        sampled = job.sample(prompt, params=SamplingParams(max_tokens=6, temperature=1.0))
        tokens = sampled.samples[0].token_ids
        trained = job.forward([sft_datum(prompt, tokens)]).result().logprobs[0][len(prompt) :]
        assert trained == pytest.approx(sampled.samples[0].logprobs, abs=2e-3)

        # Many prompts in one request: `latest` resolved once, prompt i seeded derived(i).
        seeded = SamplingParams(max_tokens=4, seed=5)
        many = job.sample_many(["12+7=", prompt], n=2, params=seeded)
        assert [r.version for r in many] == [saved.number] * 2
        assert many[1].samples == job.sample(prompt, n=2, params=seeded.derived(1)).samples

        pinned = job.sample("12+7=", params=SamplingParams(max_tokens=4), version=0)
        assert pinned.version == 0
        assert [v.number for v in job.versions()] == [1]


def test_version_lifecycle_through_the_sdk(stack, tmp_path: Path) -> None:
    """Lineage, comparison, aliases, pins held by the serving engine, and a LoRA version
    downloaded merged into its base: a Hugging Face model that computes what the trainer
    computes."""
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="lifecycle", mode="lora")
        prompt, answer = loom.tokenize(["23+4=", "27<|endoftext|>"])
        for step in range(3):
            job.forward_backward([sft_datum(prompt, answer)])
            job.optim_step(AdamParams(lr=1e-2))
            job.save_weights(aliases=["best"] if step == 1 else []).result()
        chain = job.lineage()
        assert [v.number for v in chain.versions] == [3, 2, 1] and chain.complete
        diff = job.compare(1, "latest")
        assert [c.path for c in diff.changed] == ["adapter_model.safetensors"]
        assert "adapter_config.json" in diff.unchanged and diff.shared_bytes > 0
        assert job.version("best").number == 2
        assert job.move_alias("best", 3).number == 3

        # The engine pins what it holds: once version 1 serves, it cannot be deleted.
        assert job.sample("23+4=", params=ONE_TOKEN, version=1).version == 1
        pins_url = f"{url}/v1/modelstate/pins"
        auth = {"Authorization": f"Bearer {key}"}

        def pinned() -> bool:
            pins = httpx2.get(pins_url, headers=auth).json()["pins"]
            return any(p["job_id"] == job.id and p["number"] == 1 for p in pins)

        deadline = time.monotonic() + 30
        while not pinned():
            assert time.monotonic() < deadline, "rollout never pinned the version it serves"
            time.sleep(0.1)
        with pytest.raises(Conflict, match=r"pinned by \['rollout@"):
            job.delete_version(1)

        merged = job.download(tmp_path / "merged", "latest", merge_lora=True)
        model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].log_softmax(-1)
        local = logits.gather(-1, ids[0, 1:, None])[len(prompt) - 1 :, 0].tolist()
        trained = job.forward([sft_datum(prompt, answer)]).result().logprobs[0][len(prompt) :]
        assert local == pytest.approx(trained, abs=1e-3)
        with pytest.raises(NotFound, match="no version 9"):
            job.download(tmp_path / "nothing", 9)


def test_bad_requests_through_the_gateway_are_clear_4xx(stack) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="bad-input", mode="lora")
        with pytest.raises(InvalidInput, match="max_model_len|exceed|long"):
            job.sample([1] * 600, params=SamplingParams(max_tokens=8))
        with pytest.raises(NotFound):
            job.sample("1+1=", version=7)
        with pytest.raises(NotFound):
            loom.get_job("job_does_not_exist")
        with pytest.raises((InvalidInput, NotFound), match="exact_match"):
            loom.score("no_such_verifier", [ScoreItem(response="1")])


def test_sandbox_sessions_and_registered_rewards_through_the_gateway(stack) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        with loom.open_sandbox(job_id="e2e-tools") as sandbox:
            sandbox.write_files({"state.json": "[]", "raw.bin": b"\x00\x01"})
            for _ in range(3):
                turn = sandbox.execute(
                    "import json\nstate = json.load(open('state.json'))\n"
                    "state.append(len(state))\n"
                    "json.dump(state, open('state.json', 'w'))\nprint(state)"
                )
            assert turn.stdout == "[0, 1, 2]\n", turn
            assert sandbox.read_files(["state.json", "raw.bin"]) == {
                "state.json": b"[0, 1, 2]",
                "raw.bin": b"\x00\x01",
            }
        with pytest.raises(NotFound):
            sandbox.execute("pass")  # closed with the block

        loom.register_reward(
            "short",
            "def reward(response, reference):\n    return float(len(response) < 5)\n",
            job_id="e2e-tools",
        )
        scores = loom.score(
            "python",
            [ScoreItem(response="abc"), ScoreItem(response="abcdefg")],
            {"function": "short", "job_id": "e2e-tools"},
        ).scores
        assert [s.reward for s in scores] == [1.0, 0.0]


def test_grpo_improves_held_out_accuracy(stack, tmp_path: Path) -> None:
    url, key, _ = stack
    result = run_demo(url, key, tmp_path, DemoConfig())

    assert result.accuracy_after > result.accuracy_before
    with LoomClient(url, key) as loom:
        job = loom.get_job(result.job_id)
        assert job.version("best").number == result.best_version
        # What the web admin plots: the same reward curve, logged step by step.
        logged = job.metrics(["rl/reward", "rl/samples_per_s"])
        assert logged["rl/reward"].values == pytest.approx([p["reward"] for p in result.curve])
        assert len(logged["rl/samples_per_s"].steps) == DemoConfig().rl_steps
        # The admin's progress names the phase, on its own steps; the demo ended its job.
        progress = job.info.progress
        assert progress is not None and (progress.phase, progress.step) == (
            "rl",
            DemoConfig().rl_steps,
        )
        assert job.info.status.value == "completed"
        assert {s.version for s in job.samples(limit=1000)} >= {result.curve[-1]["version"] - 1}
    versions = [point["version"] for point in result.curve]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert result.png_path is not None and result.png_path.stat().st_size > 1000
    assert result.csv_path is not None
    with result.csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == DemoConfig().rl_steps

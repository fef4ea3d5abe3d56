"""An RL loop written against the public Weaver SDK only (run unmodified by
tests/e2e/test_weaver_sdk.py): sample, score, importance_sampling (or ppo) forward_backward,
optim_step, save weights for a new sampler (by name), sample again. Prints one JSON line per
iteration."""

import json

from weaver import ServiceClient
from weaver.types import AdamParams, Datum, LoraConfig, ModelInput, SamplingParams

GOOD = 30  # the token the reward likes
with ServiceClient(name="weaver rl") as service:
    training = service.create_model(base_model="loom/tiny", lora_config=LoraConfig(rank=8))
    sampler = training.save_weights_and_get_sampling_client()
    prompt = [20, 21, 22]
    params = SamplingParams(max_tokens=6, temperature=1.0)
    for iteration in range(4):
        result = sampler.sample(
            prompt=ModelInput.from_ints(prompt), num_samples=8, sampling_params=params
        )
        sequences = result["sequences"]
        rewards = [sum(t == GOOD for t in s["tokens"]) / len(s["tokens"]) for s in sequences]
        mean = sum(rewards) / len(rewards)
        data = []
        for sequence, reward in zip(sequences, rewards, strict=True):
            tokens = prompt + sequence["tokens"]
            skip = len(prompt) - 1
            data.append(
                Datum(
                    model_input=ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={
                        "target_tokens": tokens[1:],
                        "logprobs": [0.0] * skip + list(sequence["logprobs"]),
                        "advantages": [0.0] * skip + [reward - mean] * len(sequence["tokens"]),
                        "loss_mask": [0.0] * skip + [1.0] * len(sequence["tokens"]),
                    },
                )
            )
        # importance_sampling, then PPO's clipped objective on alternate iterations
        loss, config = (
            ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
            if iteration % 2
            else ("importance_sampling", None)
        )
        trained = training.forward_backward(data, loss, loss_fn_config=config)
        training.optim_step(AdamParams(learning_rate=5e-2))
        print(
            json.dumps(
                {
                    "iteration": iteration,
                    "reward": mean,
                    "loss": trained["metrics"]["loss:sum"],
                    "versions": sorted({s["weight_version"] for s in sequences}),
                    "sampler_logprobs": [s["logprobs"] for s in sequences],
                    "trainer_logprobs": [
                        out["logprobs"]["data"][len(prompt) - 1 :]
                        for out in trained["loss_fn_outputs"]
                    ],
                }
            ),
            flush=True,
        )
        path = training.save_weights_for_sampler(name=f"iteration-{iteration}")
        sampler = service.create_sampling_client(model_path=path, base_model="loom/tiny")
    print(
        json.dumps(
            {
                "model_id": training.model_id,
                "path": path,
                "info": service.get_model(training.model_id),
            }
        ),
        flush=True,
    )

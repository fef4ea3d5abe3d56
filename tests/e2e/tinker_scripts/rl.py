"""An RL loop written against the public Tinker SDK only (run unmodified by
tests/e2e/test_tinker_sdk.py): sample, score, importance_sampling (or ppo) forward_backward,
optim_step, save weights for a new sampler, sample again. Prints one JSON line per
iteration."""

import json

import tinker
from tinker import types

GOOD = 30  # the token the reward likes
service = tinker.ServiceClient()
training = service.create_lora_training_client(base_model="loom/tiny", rank=8)
sampler = training.save_weights_and_get_sampling_client()
prompt = [20, 21, 22]
params = types.SamplingParams(max_tokens=6, temperature=1.0)
for iteration in range(4):
    result = sampler.sample(
        prompt=types.ModelInput.from_ints(prompt), num_samples=8, sampling_params=params
    ).result()
    rewards = [sum(t == GOOD for t in s.tokens) / len(s.tokens) for s in result.sequences]
    mean = sum(rewards) / len(rewards)
    data = []
    for sequence, reward in zip(result.sequences, rewards, strict=True):
        tokens = prompt + sequence.tokens
        skip = len(prompt) - 1
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * skip + list(sequence.logprobs),
                    "advantages": [0.0] * skip + [reward - mean] * len(sequence.tokens),
                },
            )
        )
    # importance_sampling, then PPO's clipped objective on alternate iterations
    loss = (
        ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
        if iteration % 2
        else ("importance_sampling", None)
    )
    trained = training.forward_backward(data, *loss).result()
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    print(
        json.dumps(
            {
                "iteration": iteration,
                "reward": mean,
                "loss": trained.metrics["loss:sum"],
                "sampler_logprobs": [list(s.logprobs) for s in result.sequences],
                "trainer_logprobs": [
                    out["logprobs"].tolist()[len(prompt) - 1 :] for out in trained.loss_fn_outputs
                ],
            }
        ),
        flush=True,
    )
    sampler = training.save_weights_and_get_sampling_client()
print(json.dumps({"model_id": training.model_id}), flush=True)
service.close("success").result()

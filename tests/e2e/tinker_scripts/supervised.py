"""A supervised loop written against the public Tinker SDK only (run unmodified by
tests/e2e/test_tinker_sdk.py): cross_entropy on one sequence, then sampling its prompt on the
trained weights and scoring the sample on the trainer (forward) and on the sampler
(compute_logprobs). Prints one JSON line per result."""

import json

import tinker
from tinker import types

service = tinker.ServiceClient()
training = service.create_lora_training_client(base_model="loom/tiny", rank=8)
tokens = [20, 21, 22, 23, 24, 25, 26, 27]
prompt, completion = tokens[:3], tokens[3:]
datum = types.Datum(
    model_input=types.ModelInput.from_ints(tokens[:-1]),
    loss_fn_inputs={
        "target_tokens": tokens[1:],
        "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(completion),
    },
)
params = types.SamplingParams(max_tokens=len(completion), temperature=0.0)
for step in range(25):
    result = training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    print(
        json.dumps(
            {
                "step": step,
                "loss": result.metrics["loss:sum"],
                "logprobs": result.loss_fn_outputs[0]["logprobs"].tolist(),
            }
        ),
        flush=True,
    )
sampler = training.save_weights_and_get_sampling_client()
after = sampler.sample(
    prompt=types.ModelInput.from_ints(prompt), num_samples=2, sampling_params=params
).result()
sampled = prompt + after.sequences[0].tokens
check = types.Datum(
    model_input=types.ModelInput.from_ints(sampled[:-1]),
    loss_fn_inputs={"target_tokens": sampled[1:]},
)
trained = training.forward([check], "cross_entropy").result()
scored = sampler.compute_logprobs(types.ModelInput.from_ints(sampled)).result()
scored_tail = sampler.compute_logprobs(
    types.ModelInput.from_ints(sampled), prompt_logprobs_last_n=3
).result()
print(
    json.dumps(
        {
            "after": [s.tokens for s in after.sequences],
            "stop": [s.stop_reason for s in after.sequences],
            "sampler_logprobs": after.sequences[0].logprobs,
            "trainer_logprobs": trained.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1 :],
            "trainer_all": trained.loss_fn_outputs[0]["logprobs"].tolist(),
            "scored": scored,
            "scored_tail": scored_tail,
        }
    ),
    flush=True,
)
service.close("success").result()

"""A supervised loop written against the public Weaver SDK only (run unmodified by
tests/e2e/test_weaver_sdk.py): cross_entropy on one sequence (-100 targets on the prompt),
calls pipelined without waiting, then sampling the prompt on the trained weights and scoring
the sample with forward_logprob (trainer) and compute_logprobs (sampler). Prints one JSON line
per result."""

import json

from weaver import ServiceClient
from weaver.types import AdamParams, Datum, LoraConfig, ModelInput, SamplingParams

with ServiceClient(name="weaver supervised") as service:
    training = service.create_model(base_model="loom/tiny", lora_config=LoraConfig(rank=8))
    tokens = [20, 21, 22, 23, 24, 25, 26, 27]
    prompt, completion = tokens[:3], tokens[3:]
    datum = Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": [-100] * (len(prompt) - 1) + completion},
    )
    for step in range(25):
        backward = training.forward_backward([datum], "cross_entropy", wait=False)
        stepped = training.optim_step(AdamParams(learning_rate=1e-2), wait=False)
        result, optimized = backward.result(), stepped.result()
        training.log_metrics({"train/loss": result["metrics"]["loss:sum"]}, step=step)
        print(
            json.dumps(
                {
                    "step": step,
                    "loss": result["metrics"]["loss:sum"],
                    "grad_norm": optimized["metrics"]["grad_norm:mean"],
                    "logprobs": result["loss_fn_outputs"][0]["logprobs"]["data"],
                    # where the official examples read it
                    "wrapped": result["result"]["loss_fn_outputs"][0]["logprobs"]["data"],
                }
            ),
            flush=True,
        )
    sampler = training.save_weights_and_get_sampling_client()
    after = sampler.sample(
        prompt=ModelInput.from_ints(prompt),
        num_samples=2,
        sampling_params=SamplingParams(max_tokens=len(completion), temperature=0.0),
    )
    sampled = prompt + after["sequences"][0]["tokens"]
    check = Datum(
        model_input=ModelInput.from_ints(sampled[:-1]),
        loss_fn_inputs={"target_tokens": sampled[1:]},
    )
    trained = training.forward([check], "forward_logprob")
    scored = sampler.compute_logprobs(prompt=ModelInput.from_ints(sampled))
    print(
        json.dumps(
            {
                "model_id": training.model_id,
                "after": [s["tokens"] for s in after["sequences"]],
                "stop": [s["stop_reason"] for s in after["sequences"]],
                "text": after["sequences"][0]["text"],
                "sampler_logprobs": after["sequences"][0]["logprobs"],
                "trainer_all": trained["loss_fn_outputs"][0]["logprobs"]["data"],
                "sampler_scored": scored,
            }
        ),
        flush=True,
    )

"""Full fine-tuning through the public Weaver SDK only (run unmodified by
tests/e2e/test_weaver_sdk.py): cross_entropy steps on every weight of a base model named with a
context-length suffix, then a sampler on the new full weights, scored by the trainer. Prints
one JSON line."""

import json

from weaver import ServiceClient
from weaver.types import AdamParams, Datum, ModelInput, SamplingParams

with ServiceClient(name="weaver full_ft") as service:
    training = service.create_model(base_model="loom/tiny:2048", training_mode="full_ft")
    tokens = [50, 51, 52, 53, 54, 55]
    datum = Datum(
        model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:]}
    )
    losses = []
    for _ in range(8):
        out = training.forward_backward([datum], "cross_entropy")
        training.optim_step(AdamParams(learning_rate=3e-3))
        losses.append(out["metrics"]["loss:sum"])
    sampler = training.save_weights_and_get_sampling_client()
    prompt = tokens[:2]
    after = sampler.sample(
        prompt=ModelInput.from_ints(prompt),
        sampling_params=SamplingParams(max_tokens=4, temperature=0.0),
    )
    (sequence,) = after["sequences"]
    sampled = prompt + sequence["tokens"]
    check = Datum(
        model_input=ModelInput.from_ints(sampled[:-1]),
        loss_fn_inputs={"target_tokens": sampled[1:]},
    )
    trained = training.forward([check], "forward_logprob")["loss_fn_outputs"][0]["logprobs"]
    print(
        json.dumps(
            {
                "losses": losses,
                "info": service.get_model(training.model_id),
                "sampled": sequence["tokens"],
                "sampler_logprobs": sequence["logprobs"],
                "trainer_logprobs": trained["data"][len(prompt) - 1 :],
            }
        ),
        flush=True,
    )

"""forward_backward_custom, the cispo and dro losses and top-k prompt logprobs, written against
the public Weaver SDK only (run unmodified by tests/e2e/test_weaver_sdk.py). Prints one JSON
line per part."""

import json

from weaver import ServiceClient
from weaver.types import AdamParams, Datum, LoraConfig, ModelInput, SamplingParams

with ServiceClient(name="weaver custom loss") as service:
    training = service.create_model(base_model="loom/tiny", lora_config=LoraConfig(rank=8))
    tokens = [20, 21, 22, 23, 24, 25, 26, 27]
    skip = 2  # targets without loss: the prompt's
    datum = Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": [-100] * skip + tokens[skip + 1 :]},
    )

    # Pull every scored target's logprob toward -0.25: a squared error, whose gradient has
    # either sign.
    def squared_error(data, logprobs_list):
        loss = sum(((logprobs[skip:] + 0.25) ** 2).sum() for logprobs in logprobs_list)
        return loss, {"datums": len(logprobs_list)}

    losses = []
    for _ in range(12):
        result = training.forward_backward_custom([datum], squared_error)
        training.optim_step(AdamParams(learning_rate=2e-2))
        losses.append(float(result["loss"]))
    check = training.forward([datum], "forward_logprob")
    final = check["loss_fn_outputs"][0]["logprobs"]["data"][skip:]
    print(
        json.dumps(
            {"custom_losses": losses, "custom_final": sum((lp + 0.25) ** 2 for lp in final)}
        ),
        flush=True,
    )

    sampler = training.save_weights_and_get_sampling_client()
    prompt = [20, 21, 22, 23]
    sampled = sampler.sample(
        prompt=ModelInput.from_ints(prompt),
        num_samples=1,
        sampling_params=SamplingParams(max_tokens=4, temperature=1.0),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=3,
    )
    sequence = sampled["sequences"][0]
    print(
        json.dumps(
            {
                "prompt_logprobs": sampled["prompt_logprobs"],
                "prompt_top": sampled["topk_prompt_logprobs"],
            }
        ),
        flush=True,
    )

    full = prompt + sequence["tokens"]
    rl = Datum(
        model_input=ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": [-100] * (len(prompt) - 1) + sequence["tokens"],
            "logprobs": [0.0] * (len(prompt) - 1) + sequence["logprobs"],
            # The sample may stop (EOS) before max_tokens.
            "advantages": [0.0] * (len(prompt) - 1) + [1.0] * len(sequence["tokens"]),
        },
    )
    print(
        json.dumps(
            {
                name: training.forward_backward([rl], name, loss_fn_config=config)["metrics"][
                    "loss:sum"
                ]
                for name, config in (("cispo", None), ("dro", {"beta": 0.1}))
            }
            | {"logprobs": sequence["logprobs"]}
        ),
        flush=True,
    )

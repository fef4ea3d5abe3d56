"""The rest of Tinker's loss and sampling surface, written against the public Tinker SDK only
(run unmodified by tests/e2e/test_tinker_sdk.py): the tokenizer, top-k logprobs of samples and
prompts, the cispo and dro losses (forward for their values, forward_backward to train), and
a client-side custom loss through forward_backward_custom. Prints one JSON line per part."""

import json

import tinker
from tinker import types

service = tinker.ServiceClient()
training = service.create_lora_training_client(base_model="loom/tiny", rank=8)
tokenizer = training.get_tokenizer()
text = "12+34="
print(
    json.dumps(
        {
            "tokenizer": tokenizer.name_or_path,
            "round_trip": tokenizer.decode(tokenizer.encode(text)),
        }
    ),
    flush=True,
)

sampler = training.save_weights_and_get_sampling_client()
prompt = [20, 21, 22, 23]
greedy = sampler.sample(
    prompt=types.ModelInput.from_ints(prompt),
    num_samples=1,
    sampling_params=types.SamplingParams(max_tokens=5, temperature=0.0),
    include_prompt_logprobs=True,
    topk_prompt_logprobs=3,
    topk_sample_logprobs=3,
).result()
sequence = greedy.sequences[0]
print(
    json.dumps(
        {
            "tokens": sequence.tokens,
            "logprobs": sequence.logprobs,
            "top": sequence.topk_logprobs,
            "prompt_logprobs": greedy.prompt_logprobs,
            "prompt_top": greedy.topk_prompt_logprobs,
        }
    ),
    flush=True,
)

# One datum of the sample, with sampler logprobs moved so that ratios differ from 1.
tokens = prompt + sequence.tokens
skip = len(prompt) - 1
shifts = [0.0, 2.5, -0.3, 0.2, -3.0]
old = [0.0] * skip + [lp + s for lp, s in zip(sequence.logprobs, shifts, strict=True)]
advantages = [0.0] * skip + [1.0, -0.5, 2.0, 0.5, -1.0]
datum = types.Datum(
    model_input=types.ModelInput.from_ints(tokens[:-1]),
    loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": old, "advantages": advantages},
)
forwards = {
    "cispo": training.forward([datum], "cispo").result(),
    "cispo_clipped": training.forward(
        [datum], "cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}
    ).result(),
    "dro": training.forward([datum], "dro", {"beta": 0.1}).result(),
}
print(
    json.dumps(
        {
            "old": old,
            "advantages": advantages,
            **{
                name: {
                    "loss": out.metrics["loss:sum"],
                    "logprobs": out.loss_fn_outputs[0]["logprobs"].tolist(),
                }
                for name, out in forwards.items()
            },
        }
    ),
    flush=True,
)
trained = {
    name: training.forward_backward([datum], name).result().metrics["loss:sum"]
    for name in ("cispo", "dro")
}
training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
print(json.dumps({"trained": trained}), flush=True)


# A custom loss: pull every target's logprob toward -0.25 (a squared error: its gradient has
# either sign, so the SDK's surrogate call carries negative weights).
def squared_error(data, logprobs_list):
    loss = sum(((logprobs[skip:] + 0.25) ** 2).sum() for logprobs in logprobs_list)
    return loss, {"custom/targets:sum": float(len(logprobs_list))}


losses = []
for _ in range(12):
    custom = training.forward_backward_custom([datum], squared_error).result()
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    losses.append(custom.metrics["loss:sum"])
check = training.forward([datum], "cross_entropy").result()
final = check.loss_fn_outputs[0]["logprobs"].tolist()[skip:]
print(
    json.dumps({"custom_losses": losses, "custom_final": sum((lp + 0.25) ** 2 for lp in final)}),
    flush=True,
)
service.close("success").result()

"""Checkpoints through the public Weaver SDK only (run unmodified by
tests/e2e/test_weaver_sdk.py): save_state, list_checkpoints, load_state_with_optimizer and
load_state on the same model, then the checkpoint loaded into a second model of the same
rank. Prints one JSON line."""

import json

from weaver import ServiceClient
from weaver.types import AdamParams, Datum, LoraConfig, ModelInput

tokens = [40, 41, 42, 43, 44, 45]
datum = Datum(
    model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:]}
)


def logprobs(client):
    return client.forward([datum], "forward_logprob")["loss_fn_outputs"][0]["logprobs"]["data"]


def step(client):
    client.forward_backward([datum], "cross_entropy")
    client.optim_step(AdamParams(learning_rate=1e-2))
    return logprobs(client)


seen = {}
with ServiceClient(name="weaver checkpoints") as service:
    training = service.create_model(base_model="loom/tiny", lora_config=LoraConfig(rank=8))
    for _ in range(3):
        step(training)
    saved = training.save_state(name="after-3")
    seen["path"], seen["type"] = saved.path, saved.checkpoint_type
    seen["at_save"] = logprobs(training)
    seen["one_step_on"] = step(training)
    step(training)
    seen["moved"] = logprobs(training)
    training.load_state_with_optimizer(saved)
    seen["loaded_with_optimizer"] = logprobs(training)
    seen["stepped_with_optimizer"] = step(training)
    training.load_state(saved.path)
    seen["loaded_weights_only"] = logprobs(training)
    seen["stepped_weights_only"] = step(training)
    seen["listed"] = [[c.name, c.path] for c in training.list_checkpoints()]
    other = service.create_model(base_model="loom/tiny", lora_config=LoraConfig(rank=8))
    other.load_state_with_optimizer(saved.path)
    seen["other_at_load"] = logprobs(other)
    seen["other_stepped"] = step(other)
    seen["model_id"], seen["other_id"] = training.model_id, other.model_id
print(json.dumps(seen), flush=True)

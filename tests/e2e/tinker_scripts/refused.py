"""A refused call on a training client, then more calls on the same client, written against
the public Tinker SDK only (run unmodified by tests/e2e/test_tinker_sdk.py): the refusal is
the call's own error, and the next numbered call proceeds at once. Prints one JSON line."""

import json
import time

import tinker
from tinker import types

service = tinker.ServiceClient()
training = service.create_lora_training_client(base_model="loom/tiny", rank=4)
tokens = [20, 21, 22, 23, 24, 25]
datum = types.Datum(
    model_input=types.ModelInput.from_ints(tokens[:-1]),
    loss_fn_inputs={"target_tokens": tokens[1:]},
)
seen = {}
try:  # a loss_fn_config key Loom does not serve: refused before it is queued
    training.forward_backward([datum], "ppo", {"no_such_option": 1.0}).result()
    seen["refused"] = None
except Exception as exc:  # noqa: BLE001 - whatever the SDK raises for a failed call
    seen["refused"] = f"{type(exc).__name__}: {exc}"[:300]
started = time.monotonic()
training.forward_backward([datum], "cross_entropy").result()
seen["warm_up_lr0"] = training.optim_step(types.AdamParams(learning_rate=0.0)).result().metrics
training.forward_backward([datum], "cross_entropy").result()
training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
seen["after_refusal_s"] = time.monotonic() - started
print(json.dumps(seen))

"""Training state written against the public Tinker SDK only (run unmodified by
tests/e2e/test_tinker_sdk.py): save_state, train on, load_state(_with_optimizer) back, list
checkpoints, and resume in new training clients from the saved state. Prints one JSON line
of what it saw."""

import json

import tinker
from tinker import types

service = tinker.ServiceClient()
rest = service.create_rest_client()
training = service.create_lora_training_client(base_model="loom/tiny", rank=8)
tokens = [20, 21, 22, 23, 24, 25, 26, 27]
datum = types.Datum(
    model_input=types.ModelInput.from_ints(tokens[:-1]),
    loss_fn_inputs={"target_tokens": tokens[1:]},
)
adam = types.AdamParams(learning_rate=1e-2)


def step(client: tinker.TrainingClient) -> None:
    client.forward_backward([datum], "cross_entropy")
    client.optim_step(adam).result()


def logprobs(client: tinker.TrainingClient) -> list[float]:
    out = client.forward([datum], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].tolist()


for _ in range(3):
    step(training)
saved = training.save_state("after-3").result()
at_save = logprobs(training)
step(training)
one_step_on = logprobs(training)  # the step the saved moments take next
for _ in range(2):
    step(training)
moved = logprobs(training)
try:
    training.save_state("after-3").result()
    reused = None
except tinker.RequestFailedError as exc:
    reused = str(exc)

training.load_state_with_optimizer(saved.path).result()
loaded_with_optimizer = logprobs(training)
step(training)
stepped_with_optimizer = logprobs(training)
training.load_state(saved.path).result()  # weights only: fresh optimizer moments
loaded_weights_only = logprobs(training)
step(training)
stepped_weights_only = logprobs(training)

sampler_path = training.save_weights_for_sampler("final").result().path
listed = rest.list_checkpoints(training.model_id).result()
info = rest.get_weights_info_by_tinker_path(saved.path).result()

resumed = service.create_training_client_from_state_with_optimizer(saved.path).result()
resumed_at_load = logprobs(resumed)
step(resumed)
resumed_stepped = logprobs(resumed)
fresh = service.create_training_client_from_state(saved.path).result()
step(fresh)
fresh_stepped = logprobs(fresh)

# The cookbook's rolling checkpoints: one more, deleted, and gone from the list.
doomed = training.save_state("rolling").result().path
rest.delete_checkpoint_from_tinker_path(doomed).result()
after_delete = [
    c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints
]

print(
    json.dumps(
        {
            "path": saved.path,
            "model_id": training.model_id,
            "sampler_path": sampler_path,
            "at_save": at_save,
            "one_step_on": one_step_on,
            "moved": moved,
            "reused": reused,
            "loaded_with_optimizer": loaded_with_optimizer,
            "stepped_with_optimizer": stepped_with_optimizer,
            "loaded_weights_only": loaded_weights_only,
            "stepped_weights_only": stepped_weights_only,
            "listed": [
                [c.checkpoint_id, c.checkpoint_type, c.tinker_path] for c in listed.checkpoints
            ],
            "info": {"base_model": info.base_model, "lora_rank": info.lora_rank},
            "resumed_model_id": resumed.model_id,
            "resumed_rank": resumed.get_info().lora_rank,
            "resumed_at_load": resumed_at_load,
            "resumed_stepped": resumed_stepped,
            "fresh_stepped": fresh_stepped,
            "after_delete": after_delete,
        }
    ),
    flush=True,
)
service.close("success").result()

"""The Tinker SDK's read calls (RestClient), checkpoint TTLs and base-model checks, written
against the public SDK only (run unmodified by tests/e2e/test_tinker_sdk.py, which then runs
the `tinker` CLI on what this printed). Prints one JSON line."""

import json
import time

import tinker
from tinker import types


def failure(call) -> str | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises for a failed call
        return f"{type(exc).__name__}: {exc}"[:400]
    return None


service = tinker.ServiceClient()
rest = service.create_rest_client()
seen = {
    "models": [
        (m.model_name, m.trainable, m.sampleable)
        for m in service.get_server_capabilities().supported_models
    ]
}
seen["unserved_training"] = failure(
    lambda: service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
)
seen["unserved_sampling"] = failure(
    lambda: service.create_sampling_client(base_model="Qwen/Qwen3-8B").result()
)

training = service.create_lora_training_client(base_model="loom/tiny", rank=4)
model_id = seen["model_id"] = training.model_id
kept = seen["kept"] = training.save_state("kept").result().path
short = seen["short"] = training.save_state("short", ttl_seconds=2).result().path
sampler = seen["sampler"] = (
    training.save_weights_for_sampler("for-later", ttl_seconds=3600).result().path
)
rest.set_checkpoint_ttl_from_tinker_path(kept, 7200).result()

run = rest.get_training_run(model_id).result()
seen["run"] = {
    "id": run.training_run_id,
    "base_model": run.base_model,
    "is_lora": run.is_lora,
    "lora_rank": run.lora_rank,
    "corrupted": run.corrupted,
    "last_sampler": run.last_sampler_checkpoint.tinker_path,
}
seen["run_by_path"] = rest.get_training_run_by_tinker_path(kept).result().training_run_id
runs = rest.list_training_runs(limit=50).result()
seen["runs"] = {
    "ids": [r.training_run_id for r in runs.training_runs],
    "total": runs.cursor.total_count,
}
listed = rest.list_checkpoints(model_id).result().checkpoints
seen["listed"] = {c.tinker_path: c.expires_at is not None for c in listed}
mine = rest.list_user_checkpoints(limit=100).result()
seen["user_checkpoints"] = [c.tinker_path for c in mine.checkpoints]
session_id = model_id.split(":")[0]  # Loom's model ids are <session>:train:<n>
session = rest.get_session(session_id).result()
seen["session"] = {"runs": session.training_run_ids, "samplers": session.sampler_ids}
seen["sessions"] = rest.list_sessions(limit=100).result().sessions
seen["unserved_rest"] = failure(lambda: rest.publish_checkpoint_from_tinker_path(kept).result())

time.sleep(3)  # `short` expires
seen["after_expiry"] = [c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints]
seen["load_expired"] = failure(lambda: training.load_state(short).result())
training.forward_backward(
    [
        types.Datum(
            model_input=types.ModelInput.from_ints([20, 21, 22]),
            loss_fn_inputs={"target_tokens": [21, 22, 23]},
        )
    ],
    "cross_entropy",
).result()
seen["next_call_ran"] = True
print(json.dumps(seen))

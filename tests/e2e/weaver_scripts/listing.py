"""The Weaver SDK's listing calls, checkpoint TTLs and base-model checks, written against the
public SDK only (run unmodified by tests/e2e/test_weaver_sdk.py). Prints one JSON line."""

import json
import time

from weaver import ServiceClient
from weaver.types import LoraConfig


def failure(call) -> str | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises for a failed call
        return f"{type(exc).__name__}: {exc}"[:400]
    return None


seen = {}
with ServiceClient(name="weaver listing") as service:
    seen["names"] = service.list_supported_models()
    seen["detailed"] = [
        (
            m.name,
            [mode.mode for mode in m.training_modes],
            str(m.training_mode("lora").price.unit_price_usd),
        )
        for m in service.list_supported_models(detailed=True)
    ]
    seen["unserved_training"] = failure(
        lambda: service.create_model(base_model="Qwen/Qwen3-8B", lora_config=LoraConfig(rank=4))
    )
    seen["unserved_sampling"] = failure(
        lambda: service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    )
    training = service.create_model(base_model="loom/tiny", lora_config=LoraConfig(rank=4))
    seen["model_id"] = training.model_id
    kept = training.save_state(name="kept")
    short = training.save_state(name="short", ttl_seconds=2)
    seen["short"] = {
        "path": short.path,
        "ttl": short.ttl_seconds,
        "expires": short.expires_at is not None,
    }
    models = service.list_models(limit=100)
    seen["models"] = {
        "ids": [m["id"] for m in models["items"]],
        "total": models["pagination"]["total_count"],
    }
    runs = service.list_training_runs(limit=100)
    seen["runs"] = [
        (r["id"], r["base_model"], r["training_mode"], r["lora_config"]) for r in runs["items"]
    ]
    run = service.get_training_run(training.model_id)
    seen["run_checkpoints"] = sorted(c["path"] for c in run["checkpoints"])
    seen["unserved_get"] = failure(service.get_quota_balance)
    time.sleep(3)  # `short` expires
    seen["after_expiry"] = [c.path for c in training.list_checkpoints()]
    seen["kept"] = kept.path
print(json.dumps(seen))

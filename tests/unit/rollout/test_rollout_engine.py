"""`RolloutEngine`'s calls into vLLM around weight swaps, against a recording stand-in for
`AsyncLLM` (the real engine is exercised in tests/integration/rollout)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.common.busy import BusyClock
from services.rollout.engine import (
    BASE_WEIGHTS_LABEL,
    UNKNOWN_WEIGHTS_LABEL,
    RolloutEngine,
    engine_args,
)
from services.rollout.settings import RolloutSettings


class RecordingLLM:
    def __init__(self, fail_reload: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_reload = fail_reload
        self.renderer = SimpleNamespace(clear_mm_cache_async=self._record("clear_mm_cache"))
        self.engine_core = SimpleNamespace(pause_scheduler_async=self._record("pause"))

    def _record(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, kwargs or args))

        return call

    async def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
        self.calls.append((method, kwargs))
        if self.fail_reload:
            raise RuntimeError("no such file")

    async def update_weight_version(self, label: str) -> None:
        self.calls.append(("label", label))

    async def resume_generation(self) -> None:
        self.calls.append(("resume", ()))

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        self.calls.append(("generate", prompt))
        yield SimpleNamespace(outputs=[])


def engine_with(llm: RecordingLLM, inflight_kv: str = "keep") -> RolloutEngine:
    settings = RolloutSettings(rollout_inflight_kv=inflight_kv)  # type: ignore[arg-type]
    engine = RolloutEngine(settings, "/model", BusyClock("busy", "test"))
    engine._llm = llm  # type: ignore[assignment]
    return engine


@pytest.mark.parametrize(("inflight_kv", "clear_cache"), [("keep", False), ("recompute", True)])
async def test_a_swap_pauses_in_keep_mode_and_clears_caches_only_to_recompute(
    inflight_kv: str, clear_cache: bool
) -> None:
    llm = RecordingLLM()
    await engine_with(llm, inflight_kv).reload_weights("/v2", "job@2")
    assert llm.calls == [
        ("clear_mm_cache", ()),
        ("pause", {"mode": "keep", "clear_cache": clear_cache}),
        ("loom_reload_weights", {"weights_path": "/v2"}),
        ("label", "job@2"),
        ("resume", ()),
    ]


async def test_requests_are_salted_with_the_loaded_weights_and_movers_apart() -> None:
    llm = RecordingLLM()
    engine = engine_with(llm)
    await engine.generate([1, 2], None)
    await engine.reload_weights("/v2", "job@2")
    await engine.generate([1, 2], None)
    await engine.generate([1, 2], None, movable=True)
    salts = [prompt["cache_salt"] for name, prompt in llm.calls if name == "generate"]
    assert salts == [BASE_WEIGHTS_LABEL, "job@2", "job@2+movable"]


async def test_a_failed_reload_labels_the_weights_unknown_and_resumes() -> None:
    llm = RecordingLLM(fail_reload=True)
    engine = engine_with(llm)
    with pytest.raises(RuntimeError, match="no such file"):
        await engine.reload_weights("/missing", "job@3")
    assert llm.calls[-2:] == [("label", UNKNOWN_WEIGHTS_LABEL), ("resume", ())]
    await engine.generate([1], None)
    assert llm.calls[-1] == (
        "generate",
        {"prompt_token_ids": [1], "cache_salt": UNKNOWN_WEIGHTS_LABEL},
    )


@pytest.mark.parametrize(("max_loras", "lora_slots"), [(4, 4), (0, None)])
def test_lora_layers_only_where_adapters_may_be_served(
    tiny_model_dir: Path, max_loras: int, lora_slots: int | None
) -> None:
    """vLLM accepts the arguments either way; 0 builds no LoRA layers at all."""
    settings = RolloutSettings(rollout_max_loras=max_loras)
    config = engine_args(settings, str(tiny_model_dir)).create_engine_config()
    assert (config.lora_config.max_loras if config.lora_config else None) == lora_slots


@pytest.mark.parametrize(
    ("model", "gib", "kv_bytes"),
    [
        ("loom/tiny", None, 64 << 20),
        ("/models/other", None, 1 << 30),
        ("loom/tiny", 2, 2 << 30),
        ("/models/other", 1 / 1024, 1 << 20),
        ("loom/tiny", 0.0625, 64 << 20),
    ],
)
def test_the_kv_cache_is_small_for_the_tiny_model_and_sized_in_bytes(
    tiny_model_dir: Path, model: str, gib: float | None, kv_bytes: int
) -> None:
    settings = RolloutSettings(rollout_model=model, rollout_kv_cache_gib=gib)
    assert settings.kv_cache_bytes == kv_bytes
    args = engine_args(settings, str(tiny_model_dir))
    assert args.kv_cache_memory_bytes == kv_bytes


def test_vllms_gib_variable_cannot_override_the_setting(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CPU platform replaces `kv_cache_memory_bytes` with VLLM_CPU_KVCACHE_SPACE GiB
    when that variable is set."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    settings = RolloutSettings(rollout_kv_cache_gib=1 / 64)
    config = engine_args(settings, str(tiny_model_dir)).create_engine_config()
    assert config.cache_config.kv_cache_memory_bytes == 16 << 20


@pytest.mark.parametrize("gib", [0, -1, 0.5 / 1024, float("nan")])
def test_a_kv_cache_under_a_mib_is_refused(gib: float) -> None:
    with pytest.raises(ValueError, match="LOOM_ROLLOUT_KV_CACHE_GIB must be at least 1 MiB"):
        RolloutSettings(rollout_kv_cache_gib=gib)

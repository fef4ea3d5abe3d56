"""A KV cache sized in MiB (LOOM_ROLLOUT_KV_CACHE_GIB below 1): a real vLLM engine starts with
exactly that many bytes of cache blocks and samples. Its own engine, not the package's."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from services.rollout.app import create_app
from services.rollout.settings import MiB, RolloutSettings
from tests.integration.rollout.conftest import PROMPT, serve_rollout

pytestmark = pytest.mark.integration

KV_MIB = 16
# The tiny model's K and V per token (4 layers x 2 KV heads x 32 dims x K,V x 4 bytes), and
# vLLM's CPU block of 128 tokens.
TOKEN_BYTES, BLOCK_TOKENS = 4 * 2 * 32 * 2 * 4, 128


async def test_an_engine_with_a_mib_sized_kv_cache_samples(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = RolloutSettings(
        data_dir=tmp_path,
        rollout_model=str(tiny_model_dir),
        rollout_kv_cache_gib=KV_MIB / 1024,
        rollout_announce=False,
    )
    app = create_app(settings)
    # This engine's processes only: in a full run, other fixtures' processes live beside it.
    others = {child.pid for child in psutil.Process().children(recursive=True)}
    async with serve_rollout(app, settings) as client:
        blocks = app.state.engine.llm.vllm_config.cache_config.num_gpu_blocks
        assert blocks == KV_MIB * MiB // (TOKEN_BYTES * BLOCK_TOKENS)  # 64, not 4096 (1 GiB)
        worker_rss = max(
            child.memory_info().rss
            for child in psutil.Process().children(recursive=True)
            if child.pid not in others
        )
        # The 1 GiB default allocated (and touched) 1 GiB; the whole worker is less now.
        assert worker_rss < 1024 * MiB, worker_rss
        response = await client.post(
            "/v1/sample",
            json={"prompt_token_ids": PROMPT, "n": 16, "params": {"max_tokens": 8, "seed": 1}},
        )
        assert response.status_code == 200, response.text
        samples = response.json()["samples"]
        assert len(samples) == 16 and all(sample["token_ids"] for sample in samples)

"""A version whose files hash right but are not weights of the served model: sampling it is a
422 that names the problem, the engine's weights are never touched, and the base and other
versions keep serving (it was a 500 that left the engine's weights half replaced)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import torch
from safetensors.torch import save_file

from modelstate.client import ModelStateClient
from modelstate.schemas import VersionKind, VersionMeta
from tests.integration.rollout.conftest import PROMPT

pytestmark = pytest.mark.integration


def version_dir(path: Path, content: dict[str, torch.Tensor] | bytes) -> Path:
    path.mkdir(parents=True)
    if isinstance(content, bytes):
        (path / "model.safetensors").write_bytes(content)
    else:
        save_file(content, path / "model.safetensors")
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"these are not weights at all, just bytes", "not a safetensors file"),
        ({"model.embed_tokens.weight": torch.zeros(3, 5)}, "has shape [3, 5]"),
        ({"not.a.tensor.of.this.model": torch.zeros(2)}, "tensors the model has not"),
    ],
    ids=["garbage", "wrong-shape", "foreign"],
)
async def test_a_version_that_is_not_weights_is_refused_and_the_engine_keeps_serving(
    rollout: httpx2.AsyncClient,
    store: ModelStateClient,
    tiny_model_dir: Path,
    tmp_path: Path,
    content: dict[str, torch.Tensor] | bytes,
    message: str,
) -> None:
    job = f"bad-{tmp_path.name[-12:]}"
    before = await rollout.post(
        "/v1/sample",
        json={"prompt_token_ids": PROMPT, "params": {"max_tokens": 4, "temperature": 0.0}},
    )
    assert before.status_code == 200, before.text
    await store.publish(
        VersionMeta(job_id=job, kind=VersionKind.full, base_model=str(tiny_model_dir)),
        version_dir(tmp_path / "v", content),
    )
    refused = await rollout.post(
        "/v1/sample", json={"job_id": job, "prompt_token_ids": PROMPT, "params": {"max_tokens": 4}}
    )
    assert refused.status_code == 422, refused.text
    assert message in refused.json()["error"]["message"]
    after = await rollout.post(
        "/v1/sample",
        json={"prompt_token_ids": PROMPT, "params": {"max_tokens": 4, "temperature": 0.0}},
    )
    assert after.status_code == 200, after.text
    assert after.json()["samples"] == before.json()["samples"]  # the same weights as before

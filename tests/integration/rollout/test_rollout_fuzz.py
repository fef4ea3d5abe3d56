"""Schemathesis against the rollout service's OpenAPI (one real vLLM engine, the model-state
store behind it): no 5xx."""

from __future__ import annotations

import httpx2
import pytest
from huggingface_hub import constants

from tests.support.fuzz import fuzz


async def test_generated_requests_get_no_server_error(
    rollout: httpx2.AsyncClient, modelstate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no hub look-up for made-up names
    openapi = (await rollout.get("/openapi.json")).json()
    report = await fuzz(rollout, openapi)
    report.check()

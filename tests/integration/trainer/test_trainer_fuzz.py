"""Schemathesis against the trainer's OpenAPI (the tiny model on CPU, a real model-state
store behind it): no 5xx."""

from __future__ import annotations

import pytest
from huggingface_hub import constants
from trainer_harness import TrainerHarness

from tests.support.fuzz import fuzz


async def test_generated_requests_get_no_server_error(
    trainer: TrainerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no hub look-up for made-up names
    report = await fuzz(trainer.http, trainer.app.openapi())
    report.check()

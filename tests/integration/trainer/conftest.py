"""The trainer app in-process (httpx2.ASGITransport), publishing to a real in-process
model-state store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from trainer_harness import TrainerHarness, serving
from transformers import AutoTokenizer

from agents.datasets.arithmetic import make_splits
from modelstate.app import create_app as create_modelstate_app
from modelstate.client import ModelStateClient
from modelstate.settings import ModelStateSettings
from services.common.service_token import service_headers
from services.common.tiny_model import EOS
from services.trainer.settings import TrainerSettings


@pytest.fixture
async def modelstate_client(tmp_path: Path) -> AsyncIterator[ModelStateClient]:
    settings = ModelStateSettings(data_dir=tmp_path / "modelstate")
    app = create_modelstate_app(settings)
    async with app.router.lifespan_context(app):
        client = ModelStateClient(
            "http://modelstate",
            transport=httpx2.ASGITransport(app),
            headers=service_headers(settings),
        )
        yield client
        await client.aclose()


@pytest.fixture
async def trainer(
    tmp_path: Path, tiny_model_dir: Path, modelstate_client: ModelStateClient
) -> AsyncIterator[TrainerHarness]:
    settings = TrainerSettings(data_dir=tmp_path / "trainer", trainer_device="cpu")
    async with serving(settings, modelstate_client, tiny_model_dir) as trainer:
        yield trainer


@pytest.fixture(scope="session")
def arithmetic_data(tiny_model_dir: Path) -> list[dict[str, Any]]:
    """20 SFT examples: the prompt `a+b=` carries no loss, the answer and EOS do."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    train = make_splits().train
    data = []
    for problem in train[:20]:
        prompt = tokenizer(problem.prompt)["input_ids"]
        answer = tokenizer(problem.answer + EOS)["input_ids"]
        data.append(
            {"input_ids": prompt + answer, "loss_mask": [0.0] * len(prompt) + [1.0] * len(answer)}
        )
    return data

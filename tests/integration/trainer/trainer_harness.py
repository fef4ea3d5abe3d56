"""Drives the in-process trainer app's operations over HTTP (a helper module, not a test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI

from modelstate.client import ModelStateClient
from services.common.service_token import service_headers
from services.trainer.app import create_app
from services.trainer.service import TrainerService
from services.trainer.settings import TrainerSettings

JOB_FULL = "job-full"
JOB_LORA = "job-lora"


class TrainerHarness:
    def __init__(self, http: httpx2.AsyncClient, app: FastAPI, base_model: str) -> None:
        self.http = http
        self.app = app
        self.base_model = base_model

    @property
    def service(self) -> TrainerService:
        service: TrainerService = self.app.state.trainer
        return service

    async def create(self, job_id: str, mode: str, **extra: Any) -> dict[str, Any]:
        body = {"job_id": job_id, "base_model": self.base_model, "mode": mode, **extra}
        response = await self.http.post("/v1/models", json=body)
        assert response.status_code == 201, response.text
        info: dict[str, Any] = response.json()
        return info

    async def submit(self, model_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(f"/v1/models/{model_id}/{action}", json=body)
        assert response.status_code == 202, response.text
        op: dict[str, Any] = response.json()
        return op

    async def wait(self, op_id: str) -> dict[str, Any]:
        while True:
            response = await self.http.get(f"/v1/operations/{op_id}", params={"wait": 60})
            assert response.status_code == 200, response.text
            op: dict[str, Any] = response.json()
            if op["status"] in ("succeeded", "failed"):
                return op

    async def run(self, model_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """Submit, wait, and return the result of an operation that must succeed."""
        op = await self.wait((await self.submit(model_id, action, body))["id"])
        assert op["status"] == "succeeded", op["error"]
        result: dict[str, Any] = op["result"]
        return result


@asynccontextmanager
async def serving(
    settings: TrainerSettings, modelstate: ModelStateClient, base_model: Path
) -> AsyncIterator[TrainerHarness]:
    """A trainer app started with `settings` (its lifespan: queue, ranks), driven over HTTP
    with the service token."""
    app = create_app(settings, modelstate=modelstate)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app),
            base_url="http://trainer",
            headers=service_headers(settings),
        ) as http,
    ):
        yield TrainerHarness(http, app, str(base_model))

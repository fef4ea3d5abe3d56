"""A trainer submission whose answer is lost is sent again under its idempotency key and runs
once: `TrainerClient` against the real trainer app."""

from __future__ import annotations

import httpx2
from fastapi import FastAPI
from trainer_harness import JOB_LORA, TrainerHarness

from services.common.service_token import SERVICE_TOKEN_HEADER
from services.trainer.client import TrainerClient
from services.trainer.schemas import (
    AdamParams,
    Datum,
    ForwardBackwardRequest,
    OptimStepRequest,
)


class LosesFirstAnswers(httpx2.AsyncBaseTransport):
    """Delivers every request to the app, and loses the answer to a POST the first time its
    idempotency key arrives (as a connection that drops after the server acted)."""

    def __init__(self, app: FastAPI) -> None:
        self.inner = httpx2.ASGITransport(app)
        self.posts: list[str | None] = []  # the idempotency key of each POST that arrived

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            key = request.headers.get("Idempotency-Key")
            self.posts.append(key)
            if self.posts.count(key) == 1:
                raise httpx2.ReadError("connection lost before the answer", request=request)
        return response


async def test_a_resent_submission_runs_once(trainer: TrainerHarness) -> None:
    await trainer.create(JOB_LORA, "lora")
    transport = LosesFirstAnswers(trainer.app)
    token = {SERVICE_TOKEN_HEADER: trainer.http.headers[SERVICE_TOKEN_HEADER]}
    client = TrainerClient("http://trainer", transport=transport, headers=token)
    batch = ForwardBackwardRequest(data=[Datum(input_ids=[1, 2, 3], loss_mask=[0, 1, 1])])
    try:
        first = await client.forward_backward(JOB_LORA, batch)
        assert transport.posts[0] == transport.posts[1]  # the same key, sent twice
        stepped = await client.run(
            "optim_step", JOB_LORA, OptimStepRequest(adam=AdamParams(lr=1e-2))
        )
        assert transport.posts[2] == transport.posts[3]
        assert (await client.wait(first)).status == "succeeded"
        # Each resent submission ran once: one optimizer step, not two.
        assert stepped["step"] == 1
        assert (await client.get_model(JOB_LORA)).step == 1
        resent = await client.forward_backward(JOB_LORA, batch, idempotency_key=transport.posts[0])
        assert resent.id == first.id
    finally:
        await client.aclose()

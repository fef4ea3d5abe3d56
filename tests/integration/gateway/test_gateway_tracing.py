"""Tracing across services: one `job.sample` through the real gateway (spans kept in memory)
and a real rollout replica (its own process, exporting by OTLP/HTTP as configured by the
standard variables) is one trace: rollout's server span is a child of the gateway's call. A
`forward_backward` through the gateway and the real trainer is one trace too, down to the
queued operation's execution, which runs after the request has answered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx2

from agents.sdk import AsyncLoomClient, Datum, LossConfig, SamplingParams
from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.common.ports import free_port
from services.trainer.app import create_app as create_trainer_app
from services.trainer.settings import TrainerSettings
from tests.support.rollout_process import RolloutProcess
from tests.support.servers import serve_in_thread
from tests.support.tracing import SpanSeen, in_memory_tracing, otlp_receiver
from tests.support.trainer import trainer_stand_in

READY_TIMEOUT_S = 400  # an engine's start on a shared 2-core machine
PROMPT = [5, 6, 7, 8, 9]


async def wait_until(check, what: str, timeout_s: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.25)


async def test_a_sample_through_the_gateway_and_rollout_is_one_trace(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    exported: list[SpanSeen] = []  # what the rollout process sends its "collector"
    with (
        in_memory_tracing() as gateway_spans,
        serve_in_thread(otlp_receiver(exported)) as collector,
        serve_in_thread(trainer_stand_in()) as trainer_url,
    ):
        port = free_port()
        settings = GatewaySettings(
            data_dir=tmp_path / "data",
            database_url=f"sqlite:///{tmp_path / 'gw.db'}",
            gateway_url=f"http://127.0.0.1:{port}",
            trainer_url=trainer_url,
            rollout_url=f"http://127.0.0.1:{free_port()}",
        )  # no static replica listens
        with serve_in_thread(create_app(settings), port) as url:
            key = settings.admin_key_file.read_text().strip()
            rollout = RolloutProcess(
                data_dir=settings.data_dir,
                model_dir=tiny_model_dir,
                gateway_url=url,
                env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_BSP_SCHEDULE_DELAY": "100"},
            )
            rollout.start()
            try:
                async with httpx2.AsyncClient(
                    base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}
                ) as http:

                    async def ready() -> bool:
                        replicas = (await http.get("/v1/rollout/replicas")).json()["replicas"]
                        return any(r["ready"] and not r["static"] for r in replicas)

                    await wait_until(ready, "the replica", READY_TIMEOUT_S)
                    async with AsyncLoomClient(url, key) as loom:
                        job = await loom.create_job(str(tiny_model_dir), mode="full")
                        out = await job.sample(
                            PROMPT, params=SamplingParams(max_tokens=4), version=0
                        )
                        assert out.samples and out.samples[0].token_ids
                    # No X-Request-ID sent: the request id the gateway answers is the trace id.
                    raw = await http.post(
                        "/v1/rollout/sample",
                        json={"prompt_token_ids": PROMPT, "params": {"max_tokens": 2}},
                    )
                    assert raw.status_code == 200, raw.text
                    request_id = raw.headers["x-request-id"]

                    async def both_exported() -> bool:
                        return (
                            sum(
                                s.attributes.get("loom.service") == "rollout"
                                and s.name == "POST /v1/sample"
                                for s in exported
                            )
                            >= 2
                        )

                    await wait_until(both_exported, "rollout's spans", 30)
            finally:
                rollout.stop()
        spans = gateway_spans()

    # The gateway's server spans of the two samples (the SDK's, a child of the SDK client's
    # span: the SDK in this process traces too; the raw request's, a root).
    servers = [
        s for s in spans if s.service == "gateway" and s.name == "POST /v1/{service}/{path:path}"
    ]
    assert len(servers) == 2, sorted({s.name for s in spans})
    by_id = {s.span_id: s for s in spans}
    for server in servers:
        trace = [s for s in spans if s.trace_id == server.trace_id]
        calls = [s for s in trace if str(s.attributes.get("url.full", "")).startswith(rollout.url)]
        assert calls, [s.name for s in trace]
        remote = [s for s in exported if s.trace_id == server.trace_id]
        assert {s.service for s in remote} == {"loom-rollout"}, remote  # its OTEL name
        rollout_server = [s for s in remote if s.parent_id in {c.span_id for c in calls}]
        assert rollout_server, (remote, calls)  # rollout's span hangs off the gateway's call
        for call in calls:  # and the call hangs off the gateway's request
            parent = by_id.get(call.parent_id or "")
            while parent is not None and parent.span_id != server.span_id:
                parent = by_id.get(parent.parent_id or "")
            assert parent is server
    assert request_id in {s.trace_id for s in servers}
    assert any(
        s.trace_id == request_id
        and s.attributes.get("loom.request_id") == request_id
        and s.attributes.get("loom.service") == "rollout"
        for s in exported
    )
    assert {s.attributes.get("loom.request_id") for s in servers} >= {request_id}


async def test_a_forward_backward_runs_in_the_trace_of_the_request_that_queued_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with in_memory_tracing() as finished:  # every app below is built (and traced) in it
        trainer = create_trainer_app(TrainerSettings(data_dir=data_dir, trainer_device="cpu"))
        with serve_in_thread(trainer) as trainer_url:
            settings = GatewaySettings(
                data_dir=data_dir,
                trainer_url=trainer_url,
                database_url=f"sqlite:///{tmp_path / 'gw.db'}",
            )
            with serve_in_thread(create_app(settings)) as url:
                key = settings.admin_key_file.read_text().strip()
                async with AsyncLoomClient(url, key) as loom:
                    job = await loom.create_job(str(tiny_model_dir), mode="full")
                    future = await job.forward_backward(
                        [Datum(input_ids=[3, 4, 5, 6], loss_mask=[0, 1, 1, 1])],
                        LossConfig(name="cross_entropy"),
                    )
                    assert (await future).loss > 0
        spans = finished()

    [operation] = [s for s in spans if s.name == "operation forward_backward"]
    assert operation.service == ""  # made by the trainer's queue, not by a server hook
    by_id = {s.span_id: s for s in spans}
    parent = by_id[operation.parent_id or ""]
    # Its parent is the trainer's server span of the submit, itself under the gateway's.
    assert (parent.service, parent.name) == (
        "trainer",
        "POST /v1/models/{model_id}/forward_backward",
    )
    chain = []
    while parent is not None:
        chain.append((parent.service, parent.name))
        parent = by_id.get(parent.parent_id or "")
    assert ("gateway", "POST /v1/{service}/{path:path}") in chain, chain
    assert {s.trace_id for s in spans if s.span_id in {operation.span_id, operation.parent_id}} == {
        operation.trace_id
    }
    assert operation.attributes["loom.queued_s"] >= 0

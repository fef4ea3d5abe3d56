"""Tracing into background tasks: a task submitted through a traced gateway carries the
request's trace context in its message; the real worker (its own process, exporting by
OTLP/HTTP as the standard variables configure it) runs the delivery in a span of its own
trace, linked to that request, and the delivery's calls to other services hang off it."""

from __future__ import annotations

import asyncio
import time

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.worker.settings import WorkerSettings
from tests.support.servers import serve_in_thread
from tests.support.tracing import SpanSeen, in_memory_tracing, otlp_receiver
from tests.support.worker import TaskStack, wait_for_task


async def test_a_delivery_is_a_trace_linked_to_the_request_that_submitted_the_task(
    stack: TaskStack,
) -> None:
    exported: list[SpanSeen] = []  # what the worker sends its "collector"
    async with stack.client() as http:
        job = await stack.create_job(http)
    broker = WorkerSettings(
        data_dir=stack.data_dir,
        **{
            name.removeprefix("LOOM_").lower(): value
            for name, value in stack.worker_env.items()
            if name.startswith("LOOM_WORKER_")
        },
    )
    with (
        in_memory_tracing() as gateway_spans,
        serve_in_thread(otlp_receiver(exported)) as collector,
    ):
        settings = GatewaySettings(
            data_dir=stack.data_dir,
            database_url=stack.database_url,
            modelstate_url=stack.modelstate_url,
        )
        with serve_in_thread(create_app(settings, broker)) as url:  # the same database
            stack.worker(
                OTEL_EXPORTER_OTLP_ENDPOINT=collector, OTEL_BSP_SCHEDULE_DELAY="100"
            ).start()
            async with stack.client() as http:
                http.base_url = url
                submitted = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})
                assert submitted.status_code == 202, submitted.text
                task = await wait_for_task(http, submitted.json()["id"], {"succeeded", "failed"})
                assert task["status"] == "succeeded", task
            deadline = time.monotonic() + 30
            while not any(s.name == "task loom.gc" for s in exported):
                assert time.monotonic() < deadline, [s.name for s in exported]
                await asyncio.sleep(0.2)
        spans = gateway_spans()

    [submit] = [
        s for s in spans if s.service == "gateway" and s.name == "POST /v1/jobs/{job_id}/tasks"
    ]
    [delivery] = [s for s in exported if s.name == "task loom.gc"]
    assert delivery.service == "loom-worker"
    assert delivery.parent_id is None and delivery.trace_id != submit.trace_id
    [(linked_trace, _)] = delivery.links
    assert linked_trace == submit.trace_id  # it points back to the submit
    assert delivery.attributes["loom.task_id"] == task["id"]
    # The delivery's call to modelstate is a child in the delivery's trace.
    calls = [s for s in exported if s.parent_id == delivery.span_id]
    assert any("/gc" in str(s.attributes.get("url.full", "")) for s in calls), calls

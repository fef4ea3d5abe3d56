"""Schemathesis against a service's own OpenAPI: requests generated from the schema (valid
ones and, as many, ones that break it) sent to the real app through the test's client, and
every answer that is a server error or a crash collected. A 5xx is a bug, except a readiness
probe's 503 (not ready is its answer) and a 502/503 saying a service this one calls is
unreachable (`allow_upstream`: a stack built without it).

Hypothesis runs in a thread of its own; each request is sent on the test's event loop, where
the app's lifespan (engines, pools, database engines) lives."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx2
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

REQUEST_TIMEOUT_S = 120.0
UPSTREAM_CODES = ("unavailable", "upstream_error")


@dataclass
class FuzzReport:
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    target: int = 200

    def summary(self) -> str:
        return f"{self.sent} requests, statuses {dict(sorted(self.statuses.items()))}"

    def check(self) -> None:
        """At least `target` requests sent, none answered with a server error or a crash."""
        print(self.summary())
        assert self.sent >= self.target, self.summary()
        assert not self.server_errors, "\n".join(self.server_errors)


async def fuzz(
    client: httpx2.AsyncClient,
    openapi: dict[str, Any],
    *,
    examples: int = 200,
    skip: frozenset[str] = frozenset(),
    allow_upstream: bool = False,
) -> FuzzReport:
    """Send `examples` generated requests or more, spread over every operation of `openapi`
    but those whose label (e.g. "GET /v1/events") is in `skip`."""
    schema = schemathesis.openapi.from_dict(openapi)
    operations = [result.ok() for result in schema.get_all_operations()]
    operations = [op for op in operations if op.label not in skip]
    loop = asyncio.get_running_loop()
    report = FuzzReport(target=examples)
    base_url = str(client.base_url).rstrip("/")

    def send(case: schemathesis.Case) -> None:
        kwargs = case.as_transport_kwargs(base_url=base_url)
        if isinstance(kwargs.get("data"), bytes | str):
            kwargs["content"] = kwargs.pop("data")
        kwargs.pop("cookies", None)
        label = f"{case.operation.label}: {kwargs}"[:400]
        try:
            response = asyncio.run_coroutine_threadsafe(client.request(**kwargs), loop).result(
                REQUEST_TIMEOUT_S
            )
        except (httpx2.InvalidURL, UnicodeEncodeError):  # the client would not send it
            return
        except Exception as exc:  # a crash of the app (ASGI) or of the server
            report.sent += 1
            report.server_errors.append(f"{label} -> {type(exc).__name__}: {exc}")
            return
        report.sent += 1
        report.statuses[response.status_code] += 1
        probe_says_not_ready = response.status_code == 503 and case.operation.path.endswith(
            "/readyz"
        )
        if (
            response.status_code >= 500
            and not probe_says_not_ready
            and not (allow_upstream and _upstream_error(response))
        ):
            report.server_errors.append(f"{label} -> {response.status_code} {response.text[:300]}")

    def run_all() -> None:
        # Every operation once, then more rounds (other fixed seeds: the same requests every
        # run) until `examples` were sent; what an operation with little to vary (no
        # parameters) leaves goes to the ones after it.
        for round_ in range(4):
            for done, operation in enumerate(operations):
                left = examples - report.sent
                if round_ and left <= 0:
                    return
                per_mode = max(2, math.ceil(left / (2 * (len(operations) - done))))
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    test = seed(round_)(
                        settings(
                            max_examples=per_mode,
                            database=None,
                            deadline=None,
                            suppress_health_check=list(HealthCheck),
                        )(given(operation.as_strategy(generation_mode=mode))(send))
                    )
                    try:
                        test()
                    except Unsatisfiable:  # nothing in the schema to break (no parameters)
                        continue
            if report.sent >= examples:
                return

    await asyncio.to_thread(run_all)
    return report


def _upstream_error(response: httpx2.Response) -> bool:
    try:
        error = response.json()["error"]
        code = error["code"] if isinstance(error, dict) else error  # Loom's, or Weaver's shape
    except (ValueError, KeyError, TypeError):
        return False
    return response.status_code in (502, 503) and code in UPSTREAM_CODES

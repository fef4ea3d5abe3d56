"""Contract tests: every route a typed client calls exists in its server's OpenAPI, with the
method, path parameters, request and response schemas the server declares; and every route a
service has is called by its client, or named below with the reason it is not."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

from services.common.http import Route
from services.common.schemas import Operation
from services.reward.schemas import ScoreRequest, ScoreResponse
from tests.support.openapi import openapi_of

# Each service's typed client module.
SERVICE_CLIENTS: dict[str, str] = {
    "modelstate.client": "modelstate",
    "services.reward.client": "reward",
    "services.rollout.client": "rollout",
    "services.sandbox.client": "sandbox",
    "services.trainer.client": "trainer",
}
# Every module of typed clients and the server it calls (the gateway's internal routes have
# several callers, its public ones the SDK: `test_sdk_contract`).
CLIENTS: dict[str, str] = {
    **SERVICE_CLIENTS,
    "services.rollout.gateway_calls": "gateway",
    "services.worker.gateway_calls": "gateway",
}
# Every service's own operational routes, read by probes and Prometheus, not by a client.
OPERATIONAL = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
# Routes no typed client calls, and who does.
NOT_IN_CLIENTS: dict[str, set[tuple[str, str]]] = {
    "services.rollout.client": {
        # NDJSON streamed to the SDK's RolloutStream.
        ("POST", "/v1/rollouts"),
        # The OpenAI-compatible API, called by OpenAI clients (agents' own, or any).
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/trajectories/{trajectory_id}/completions"),
        ("POST", "/v1/trajectories/{trajectory_id}/chat/completions"),
        ("GET", "/v1/models"),
    },
}
JSON = "application/json"


def routes_of(module: ModuleType) -> dict[str, Route[Any]]:
    """The module's Routes, at its top level or in its classes."""
    scopes = [
        vars(module),
        *(
            vars(value)
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == module.__name__
        ),
    ]
    return {
        name: value for scope in scopes for name, value in scope.items() if isinstance(value, Route)
    }


def _schema_name(content: dict[str, Any] | None) -> str | None:
    schema = (content or {}).get(JSON, {}).get("schema", {})
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def _fields(openapi: dict[str, Any], name: str) -> set[str]:
    return set(openapi["components"]["schemas"][name].get("properties", {}))


def _check_schema(
    openapi: dict[str, Any], declared: str | None, model: type[BaseModel], what: str, mode: str
) -> list[str]:
    if declared != model.__name__:
        return [f"{what}: the server declares {declared}, the client sends {model.__name__}"]
    ours = set(model.model_json_schema(mode=mode)["properties"])  # type: ignore[arg-type]
    if ours != _fields(openapi, declared):
        return [
            f"{what}: fields {sorted(ours)} != the server's {sorted(_fields(openapi, declared))}"
        ]
    return []


def problems(route: Route[Any], openapi: dict[str, Any]) -> list[str]:
    """What in `route` does not match the server's OpenAPI (empty: it matches)."""
    where = f"{route.method} {route.path}"
    operation = openapi["paths"].get(route.path, {}).get(route.method.lower())
    if operation is None:
        return [f"{where}: no such route on the server"]
    found: list[str] = []
    body = _schema_name(operation.get("requestBody", {}).get("content"))
    if route.request is not None:
        found += _check_schema(openapi, body, route.request, f"{where} request", "validation")
    elif body is not None:
        found.append(f"{where}: the server takes a {body} body the client does not send")
    if route.response is not None:
        answers = [
            _schema_name(answer.get("content"))
            for status, answer in operation["responses"].items()
            if status.startswith("2")
        ]
        declared = next((name for name in answers if name), None)
        found += _check_schema(
            openapi, declared, route.response, f"{where} response", "serialization"
        )
    return found


@pytest.fixture(scope="module")
def openapis(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {
        module: openapi_of(service, tmp_path_factory.mktemp(service))
        for module, service in CLIENTS.items()
    }


@pytest.mark.parametrize("client_module", sorted(CLIENTS))
def test_every_client_route_is_the_servers(
    client_module: str, openapis: dict[str, dict[str, Any]]
) -> None:
    routes = routes_of(importlib.import_module(client_module))
    assert routes
    found = [
        problem for route in routes.values() for problem in problems(route, openapis[client_module])
    ]
    assert found == []


@pytest.mark.parametrize("client_module", sorted(SERVICE_CLIENTS))
def test_every_server_route_has_a_client_method_or_a_reason(
    client_module: str, openapis: dict[str, dict[str, Any]]
) -> None:
    served = {
        (method.upper(), path)
        for path, operations in openapis[client_module]["paths"].items()
        for method in operations
    }
    called = {
        (route.method, route.path)
        for route in routes_of(importlib.import_module(client_module)).values()
    }
    exempt = NOT_IN_CLIENTS.get(client_module, set())
    assert served - called - exempt - OPERATIONAL == set()
    assert exempt - served == set()  # a reason for a route that no longer exists goes too


@pytest.mark.parametrize("client_module", sorted(CLIENTS))
def test_a_client_writes_paths_in_its_routes_only(client_module: str) -> None:
    """A path written anywhere else would be a call this test cannot see."""
    source = Path(importlib.import_module(client_module).__file__ or "").read_text()
    assert paths_outside_routes(source) == []


def paths_outside_routes(source: str) -> list[str]:
    """The `/v1/...` strings of `source` that are not an argument of a `Route(...)`."""
    tree = ast.parse(source)
    in_routes = {
        id(node)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Route"
        for node in ast.walk(call)
    }
    return [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("/v1/")
        and id(node) not in in_routes
    ]


def test_a_path_outside_a_route_is_caught() -> None:
    source = 'A = Route(\n    "GET",\n    "/v1/ok",\n    X,\n)\nB = "/v1/hidden"\n'
    assert paths_outside_routes(source) == ["'/v1/hidden'"]


PLANTED: list[tuple[Route[Any], str]] = [
    (Route("POST", "/v1/scores", ScoreResponse, ScoreRequest), "no such route"),
    (Route("GET", "/v1/score", ScoreResponse, ScoreRequest), "no such route"),
    (Route("POST", "/v1/score", Operation, ScoreRequest), "response: the server declares"),
    (Route("POST", "/v1/score", ScoreResponse, Operation), "request: the server declares"),
    (Route("POST", "/v1/score", ScoreResponse), "body the client does not send"),
]


@pytest.mark.parametrize(("route", "expected"), PLANTED)
def test_a_planted_wrong_route_is_caught(
    route: Route[Any], expected: str, openapis: dict[str, dict[str, Any]]
) -> None:
    found = problems(route, openapis["services.reward.client"])
    assert len(found) == 1 and expected in found[0]


def test_a_planted_wrong_field_is_caught(openapis: dict[str, dict[str, Any]]) -> None:
    class ScoreRequest(BaseModel):  # the server's name, other fields
        verifier: str
        item: str

    route = Route("POST", "/v1/score", ScoreResponse, ScoreRequest)
    found = problems(route, openapis["services.reward.client"])
    assert len(found) == 1 and "fields" in found[0]

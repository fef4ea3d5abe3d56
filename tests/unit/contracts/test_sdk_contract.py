"""Contract test of the SDK against the gateway: every request `agents/sdk` sends itself (read
from its source, not run) is a route of the gateway's OpenAPI, or, under `/v1/<service>/`, a
route of that service's OpenAPI the gateway proxies to. What it sends through a service's typed
client (`GatewayHttp.trainer`, `.rollout`, ...) is checked with that client's routes
(`test_client_contracts`)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.openapi import openapi_of

SDK = Path(__file__).resolve().parents[3] / "agents" / "sdk"
PROXIED = ("modelstate", "reward", "rollout", "sandbox", "trainer")
PROXY_ROUTE = "/v1/{service}/{path}"
ANY = "{}"  # a path segment the SDK fills in at run time
# The HTTP method of each call the SDK's transport offers; the others name theirs first.
METHODS = {"get_json": "GET", "post_json": "POST"}
NAMED_METHOD = ("request", "stream", "build_request")


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # segments the SDK fills in are ANY
    where: str


class _PathReader:
    """Turns one module's path expressions into templates: literals, f-strings, module
    constants and `self.<property>` returning one of those; anything else is unknown."""

    def __init__(self, tree: ast.Module) -> None:
        self.constants = {
            target.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        self.properties = {
            node.name: node.body[-1].value
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and node.body
            and isinstance(node.body[-1], ast.Return)
            and node.body[-1].value is not None
            and any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
        }

    def template(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.constants:
            return self.template(self.constants[node.id])
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr in self.properties
        ):
            return self.template(self.properties[node.attr])
        if isinstance(node, ast.JoinedStr):
            return "".join(
                (self.template(value.value) or ANY)
                if isinstance(value, ast.FormattedValue)
                else (self.template(value) or "")
                for value in node.values
            )
        return None


def sdk_calls() -> tuple[list[Call], list[str]]:
    """The SDK's requests, and where it sends one whose path this reader cannot tell."""
    calls: list[Call] = []
    unknown: list[str] = []
    for source in sorted(SDK.glob("*.py")):
        tree = ast.parse(source.read_text())
        reader = _PathReader(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, args = node.func.attr, node.args
            where = f"{source.name}:{node.lineno}"
            if name in METHODS and args:
                method, path_node = METHODS[name], args[0]
            elif (
                name in NAMED_METHOD
                and len(args) >= 2
                and isinstance(args[0], ast.Constant)
                and isinstance(args[0].value, str)
            ):
                method, path_node = args[0].value, args[1]
            else:
                continue
            path = reader.template(path_node)
            if path is None or not path.startswith("/v1/"):
                unknown.append(where)
            else:
                calls.append(Call(method, path.split("?")[0], where))
    return calls, unknown


def _matches(sent: str, served: str) -> bool:
    ours, theirs = sent.strip("/").split("/"), served.strip("/").split("/")
    for index, segment in enumerate(theirs):
        if segment == "{path}":  # a path of its own (`{path:path}`): the rest
            return len(ours) > index
        if index >= len(ours):
            return False
        if segment != ours[index] and ANY not in ours[index] and not segment.startswith("{"):
            return False
    return len(ours) == len(theirs)


def problem(call: Call, openapis: dict[str, dict[str, Any]]) -> str | None:
    """Why `call` reaches no route (None: it does)."""
    targets = [("gateway", call.path)]
    service = call.path.split("/")[2]
    if service in PROXIED:
        targets.append((service, "/v1/" + call.path.split("/", 3)[3]))
    for server, path in targets:
        for served, operations in openapis[server]["paths"].items():
            if (
                served != PROXY_ROUTE
                and _matches(path, served)
                and (call.method.lower() in operations)
            ):
                return None
    return f"{call.where}: {call.method} {call.path} is no route of the gateway or its services"


@pytest.fixture(scope="module")
def openapis(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {
        service: openapi_of(service, tmp_path_factory.mktemp(service))
        for service in ("gateway", *PROXIED)
    }


def test_every_sdk_request_is_a_route(openapis: dict[str, dict[str, Any]]) -> None:
    calls, unknown = sdk_calls()
    assert len(calls) >= 10  # the reader still finds the SDK's own requests (the gateway's)
    # A path this reader cannot tell is a request no test checks: spell it as a literal, an
    # f-string, a module constant or a property returning one.
    assert unknown == [], "requests whose path the contract test cannot read"
    assert [found for call in calls if (found := problem(call, openapis))] == []


@pytest.mark.parametrize(
    "call",
    [
        Call("POST", "/v1/rollout/sampel", "planted"),
        Call("GET", "/v1/rollout/sample", "planted"),
        Call("POST", "/v1/jobs/{}/metric", "planted"),
        Call("DELETE", "/v1/modelstate/jobs/{}/versions/{}/lineage", "planted"),
    ],
)
def test_a_planted_wrong_sdk_request_is_caught(
    call: Call, openapis: dict[str, dict[str, Any]]
) -> None:
    assert problem(call, openapis) is not None

"""Every internal service asks for the service token on every route it has (enumerated from
the app itself, so a route added later is covered), except health, readiness and metrics.

The apps are built by their real `create_app` and called in process without their lifespans:
the token is checked before routing, so nothing a lifespan builds (vLLM, databases,
sandboxes) is needed to show a refusal. With the token, a request gets past the check; what the
route then answers without its lifespan (404, 422, 500) is not the point here, only that it is
not 401. The real stacks (tests/e2e) show the token working end to end."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.service_token import SERVICE_TOKEN_HEADER

TOKEN = "s" * 40
OPEN_PATHS = {"/healthz", "/readyz", "/metrics"}
PATH_PARAM = re.compile(r"\{[^}]+\}")


def _rollout(settings: dict) -> FastAPI:
    from services.rollout.app import create_app
    from services.rollout.settings import RolloutSettings

    return create_app(RolloutSettings(**settings))


def _reward(settings: dict) -> FastAPI:
    from services.reward.app import create_app
    from services.reward.settings import RewardSettings

    return create_app(RewardSettings(**settings))


def _sandbox(settings: dict) -> FastAPI:
    from services.sandbox.app import create_app
    from services.sandbox.settings import SandboxSettings

    return create_app(SandboxSettings(**settings))


def _trainer(settings: dict) -> FastAPI:
    from services.trainer.app import create_app
    from services.trainer.settings import TrainerSettings

    return create_app(TrainerSettings(**settings))


def _modelstate(settings: dict) -> FastAPI:
    from modelstate.app import create_app
    from modelstate.settings import ModelStateSettings

    return create_app(ModelStateSettings(**settings))


INTERNAL: dict[str, Callable[[dict], FastAPI]] = {
    "rollout": _rollout,
    "reward": _reward,
    "sandbox": _sandbox,
    "trainer": _trainer,
    "modelstate": _modelstate,
}


class PastTheCheck:
    """Innermost: records every request that got past the token check, i.e. that could reach
    a route."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


def calls(app: FastAPI) -> list[tuple[str, str]]:
    """(method, a concrete path) for every route of `app`: its OpenAPI operations and the
    routes OpenAPI leaves out (docs, metrics)."""
    found = {
        (method, PATH_PARAM.sub("1", route.path))
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
    }
    documented = {
        (method.upper(), PATH_PARAM.sub("1", path))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    assert documented <= found
    return sorted(found)


@pytest.mark.parametrize("service", sorted(INTERNAL))
async def test_every_route_but_the_probes_refuses_a_call_without_the_service_token(
    service: str, tmp_path: Path
) -> None:
    app = INTERNAL[service]({"data_dir": tmp_path, "service_token": TOKEN})
    past: list[str] = []
    app.user_middleware.append(Middleware(PastTheCheck, seen=past))
    routes = calls(app)
    assert len(routes) > len(OPEN_PATHS)
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://service") as client:
        for method, path in routes:
            if path in OPEN_PATHS:
                continue
            for headers in ({}, {SERVICE_TOKEN_HEADER: "x" * 40}):
                refused = await client.request(method, path, headers=headers, json={})
                assert refused.status_code == 401, (method, path, headers)
                if method != "HEAD":
                    assert "LOOM_SERVICE_TOKEN" in refused.json()["error"]["message"]
        assert past == []  # no refused request reached routing, so no handler ran

        for method, path in routes:
            if path in OPEN_PATHS:  # no token needed
                probe = await client.request(method, path)
                # Without its lifespan a service may answer /readyz with 503: not refused.
                assert probe.status_code in ((200, 503) if path == "/readyz" else (200,)), path
                continue
            allowed = await asyncio.wait_for(
                client.request(method, path, headers={SERVICE_TOKEN_HEADER: TOKEN}, json={}),
                timeout=30,
            )
            assert allowed.status_code != 401, (method, path, allowed.text[:300])
    assert sorted(past) == [f"{method} {path}" for method, path in routes]

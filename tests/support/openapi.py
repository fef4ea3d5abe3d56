"""Each Loom server's OpenAPI document, built from its app without starting it (contract
tests compare clients with these)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from fastapi import FastAPI

# service -> (app module, settings module, settings class)
SERVERS: dict[str, tuple[str, str, str]] = {
    "gateway": ("gateway.app", "gateway.settings", "GatewaySettings"),
    "modelstate": ("modelstate.app", "modelstate.settings", "ModelStateSettings"),
    "reward": ("services.reward.app", "services.reward.settings", "RewardSettings"),
    "rollout": ("services.rollout.app", "services.rollout.settings", "RolloutSettings"),
    "sandbox": ("services.sandbox.app", "services.sandbox.settings", "SandboxSettings"),
    "trainer": ("services.trainer.app", "services.trainer.settings", "TrainerSettings"),
}


def openapi_of(service: str, data_dir: Path) -> dict[str, Any]:
    app_module, settings_module, settings_class = SERVERS[service]
    settings = getattr(importlib.import_module(settings_module), settings_class)(data_dir=data_dir)
    app: FastAPI = importlib.import_module(app_module).create_app(settings)
    return app.openapi()

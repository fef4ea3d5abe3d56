"""Typed dependencies: the long-lived objects `create_app`'s lifespan put on app.state.
(The broadcaster's own dependency, `EventsDep`, lives next to it in `events.py`.)"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from modelstate.settings import ModelStateSettings
from modelstate.store import ModelStore


def get_store(request: Request) -> ModelStore:
    return request.app.state.store  # type: ignore[no-any-return]


def get_settings(request: Request) -> ModelStateSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


StoreDep = Annotated[ModelStore, Depends(get_store)]
SettingsDep = Annotated[ModelStateSettings, Depends(get_settings)]

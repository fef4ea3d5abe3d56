"""Typed dependencies: the long-lived objects `create_app`'s lifespan put on app.state.
(The broadcaster's own dependency, `EventsDep`, lives next to it in `events.py`.)"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from modelstate.gc import Collector
from modelstate.settings import ModelStateSettings
from modelstate.store import ModelStore
from services.common.deps import app_state

StoreDep = Annotated[ModelStore, Depends(app_state("store"))]
SettingsDep = Annotated[ModelStateSettings, Depends(app_state("settings"))]
CollectorDep = Annotated[Collector, Depends(app_state("collector"))]

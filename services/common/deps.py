"""Dependency helpers shared by every service's `deps.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request


def app_state(attribute: str) -> Callable[[Request], Any]:
    """A dependency giving `app.state.<attribute>`: a long-lived object the app's lifespan
    built. Services name it with a typed alias: `StoreDep = Annotated[ModelStore,
    Depends(app_state("store"))]`."""

    def dependency(request: Request) -> Any:
        return getattr(request.app.state, attribute)

    dependency.__name__ = f"app_state_{attribute}"
    return dependency

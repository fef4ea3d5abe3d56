"""Typed dependencies for the sandbox routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from services.common.deps import app_state
from services.sandbox.backend import Backend

BackendDep = Annotated[Backend, Depends(app_state("backend"))]

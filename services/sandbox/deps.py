"""Typed dependencies for the sandbox routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from services.common.deps import app_state
from services.sandbox.agent_pool import AgentBackend
from services.sandbox.sessions import SessionManager

BackendDep = Annotated[AgentBackend, Depends(app_state("backend"))]
SessionsDep = Annotated[SessionManager, Depends(app_state("sessions"))]

"""Run one service with uvicorn: `python -m services.<name>` calls `serve(<name>, factory)`."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from services.common.logs import configure_logging
from services.common.settings import LoomSettings


def serve(service: str, factory: Callable[[], FastAPI], settings: LoomSettings) -> None:
    configure_logging(service, settings.log_level)
    host, port = settings.bind_of(service)
    uvicorn.run(
        factory(),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )

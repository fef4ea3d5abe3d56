"""Run one service with uvicorn: `python -m services.<name>` calls `serve(<name>, factory)`."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from services.common.http import CLIENT_KEEP_ALIVE_S
from services.common.logs import configure_logging
from services.common.settings import LoomSettings

SERVER_KEEP_ALIVE_S = 75
assert SERVER_KEEP_ALIVE_S > CLIENT_KEEP_ALIVE_S


def serve(service: str, factory: Callable[[], FastAPI], settings: LoomSettings) -> None:
    configure_logging(service, settings.log_level)
    settings.ensure_data_dir()  # before anything writes into it with a looser mode
    host, port = settings.bind_of(service)
    uvicorn.run(
        factory(),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
        # Longer than any Loom client keeps an idle connection (httpx2: 5 s), so the client
        # always closes first. With equal timeouts a request sent on a connection the server
        # is closing at that instant fails with a ReadError (seen under the demo's load).
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )

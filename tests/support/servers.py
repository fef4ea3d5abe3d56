"""A real uvicorn server in a thread, for integration tests that need a listening port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from services.common.serve import SERVER_KEEP_ALIVE_S


@contextmanager
def serve_in_thread(app: FastAPI, port: int | None = None) -> Iterator[str]:
    """Run `app` (lifespan included) until the block ends; yields its base URL.

    With no `port`, a free one is bound here and handed to uvicorn (no race for it); give a
    port to restart a service where its clients expect it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port or 0))
    bound = int(sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


class RestartableServer:
    """An app served in a thread that a test stops and starts again on the same port: a
    crash and restart of the service, which loses whatever it held in memory."""

    def __init__(self, factory: Callable[[], FastAPI]) -> None:
        self.factory = factory
        self.port: int | None = None
        self._serving: contextlib.AbstractContextManager[str] | None = None

    def start(self) -> str:
        self._serving = serve_in_thread(self.factory(), self.port)
        url = self._serving.__enter__()
        self.port = int(url.rsplit(":", 1)[1])
        return url

    def stop(self) -> None:
        if self._serving is not None:
            serving, self._serving = self._serving, None
            serving.__exit__(None, None, None)

    def restart(self) -> str:
        self.stop()
        return self.start()

"""`python -m modelstate` as a real process, for tests that kill it or measure it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from services.common.ports import free_port


class StoreProcess:
    """`python -m modelstate` on a fixed port and data dir, restartable."""

    def __init__(self, data_dir: Path, database_url: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.env = {
            **os.environ,
            "LOOM_DATA_DIR": str(data_dir),
            "LOOM_MODELSTATE_URL": self.url,
            "LOOM_DATABASE_URL": database_url,
            "LOOM_MODELSTATE_GC_INTERVAL_S": "0",
        }
        self.blob_dir = data_dir / "blobs"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "modelstate"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "modelstate exited during start-up"
            try:
                if httpx2.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("modelstate did not become ready")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

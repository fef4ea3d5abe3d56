"""`python -m services.rollout` as a real process (a replica), for tests and benchmarks that run
several, kill one, or pin each to a core."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from services.common.ports import free_port


class RolloutProcess:
    """One rollout replica in its own session, so a kill takes its vLLM engine processes with
    it (a crashed host's replica)."""

    def __init__(
        self,
        *,
        data_dir: Path,
        model_dir: Path,
        gateway_url: str,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.env = {
            **os.environ,
            "LOOM_DATA_DIR": str(data_dir),
            "LOOM_ROLLOUT_URL": self.url,
            "LOOM_GATEWAY_URL": gateway_url,
            "LOOM_ROLLOUT_MODEL": str(model_dir),
            "LOOM_ROLLOUT_HEARTBEAT_S": "0.5",
            **(env or {}),
        }
        self.log_path = log_path or data_dir / f"rollout-{self.url.rsplit(':', 1)[1]}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def replica_id(self) -> str:
        return self.url.removeprefix("http://")

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.rollout"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL the replica and its engine processes: no goodbye to the gateway."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM: a graceful shutdown (it leaves the gateway's table), then SIGKILL any
        engine process left in its session."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def bound_cores(self) -> set[int]:
        """The cores the threads of this replica's processes are bound to: those whose
        affinity is narrower than the host's (the engine's OpenMP threads)."""
        assert self.process is not None
        host = os.sched_getaffinity(0)
        bound: set[int] = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                # The session id is the 4th field after the command's closing parenthesis.
                if int(stat.read_text().rsplit(")", 1)[1].split()[3]) != self.process.pid:
                    continue
                for task in (stat.parent / "task").iterdir():
                    cores = os.sched_getaffinity(int(task.name))
                    if cores != host:
                        bound |= cores
        return bound

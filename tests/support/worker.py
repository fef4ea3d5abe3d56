"""Helpers for the background-task integration tests: a gate to hold a request mid-way, the
worker as a subprocess, and the stack (gateway on a real database, a real modelstate, a
broker) they run against."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import psutil
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.app import create_app
from gateway.settings import GatewaySettings
from modelstate.app import create_app as create_modelstate
from modelstate.client import ModelStateClient
from modelstate.schemas import Version, VersionKind, VersionMeta
from modelstate.settings import ModelStateSettings
from services.common.settings import LoomSettings
from services.trainer.app import create_app as create_trainer
from services.trainer.settings import TrainerSettings
from services.worker.settings import WorkerSettings
from services.worker.startup import is_ready
from tests.conftest import REDIS_URL
from tests.support.servers import RestartableServer, serve_in_thread
from tests.support.trainer import trainer_stand_in

# A database number of our own: nothing else's keys, and other tests' never ours.
WORKER_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/11"
HEARTBEAT_S = 0.5  # stale after 1.5 s: a lost worker's task is taken over quickly


class Gate:
    """Holds requests to one path while closed, so a test can act while a task is mid-way."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.opened.set()
        self.calls = 0
        self.let_through = 0

    def close(self, after: int = 0) -> None:
        """Hold the requests to the path from the `after + 1`-th one on (counted from now)."""
        self.entered.clear()
        self.let_through = after
        self.opened.clear()


class GateMiddleware:
    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self.gate.path:
            self.gate.calls += 1
            if self.gate.let_through > 0:
                self.gate.let_through -= 1
            else:
                self.gate.entered.set()
                while not self.gate.opened.is_set():
                    await asyncio.sleep(0.02)
        await self.app(scope, receive, send)


@dataclass
class Worker:
    """`python -m services.worker` in a session of its own."""

    env: dict[str, str]
    log_path: Path
    ready_file: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.worker"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not is_ready(self.ready_file, self.process.pid):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def pool_children(self) -> list[psutil.Process]:
        return psutil.Process(self.pid).children()

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool children at once."""
        self._signal_group(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()

    def _signal_group(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class TaskStack:
    url: str
    admin_key: str
    database_url: str
    modelstate_url: str
    data_dir: Path
    base_model: Path
    gate: Gate
    trainer: RestartableServer
    trainer_gate: Gate = field(default_factory=lambda: Gate(""))
    workers: list[Worker] = field(default_factory=list)
    worker_env: dict[str, str] = field(default_factory=dict)

    def client(self, key: str | None = None) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            base_url=self.url,
            timeout=60,
            headers={"Authorization": f"Bearer {key or self.admin_key}"},
        )

    def modelstate(self) -> ModelStateClient:
        return ModelStateClient.from_settings(LoomSettings(modelstate_url=self.modelstate_url))

    def worker(self, **env: str) -> Worker:
        """A worker (not started yet); `env`: extra LOOM_* variables."""
        index = len(self.workers)
        worker = Worker(
            {**self.worker_env, **env},
            self.data_dir / f"worker-{index}.log",
            WorkerSettings(data_dir=self.data_dir).ready_file,
        )
        self.workers.append(worker)
        return worker

    @contextlib.contextmanager
    def modelstate_at(self, port: int) -> Iterator[str]:
        """Another modelstate over the same database and blobs, served at `port`: the store
        coming back where a worker expects it."""
        app = create_modelstate(
            ModelStateSettings(
                data_dir=self.data_dir, database_url=self.database_url, modelstate_gc_interval_s=0
            )
        )
        with serve_in_thread(app, port=port) as url:
            yield url

    async def create_job(self, http: httpx2.AsyncClient) -> str:
        response = await http.post("/v1/jobs", json={"base_model": str(self.base_model)})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def publish(
        self, job_id: str, directory: Path, step: int, kind: VersionKind = VersionKind.lora
    ) -> Version:
        client = self.modelstate()
        try:
            return await client.publish(
                VersionMeta(job_id=job_id, kind=kind, base_model=str(self.base_model), step=step),
                directory,
            )
        finally:
            await client.aclose()


async def wait_for_task(
    http: httpx2.AsyncClient,
    task_id: str,
    until: set[str] | Callable[[dict[str, Any]], bool],
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """The task once its status is one of `until`, or once `until(task)` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = await http.get(f"/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        task: dict[str, Any] = response.json()
        if until(task) if callable(until) else task["status"] in until:
            return task
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} still {task['status']}: {task}")
        await asyncio.sleep(0.1)


def build_stack(
    tmp_path: Path,
    database_url: str,
    tiny_model_dir: Path,
    broker: dict[str, str],
    *,
    real_trainer: bool = False,
) -> Iterator[TaskStack]:
    """The stack over `broker` (LOOM_WORKER_* values); workers are started by the tests.
    The trainer is a stand-in unless `real_trainer`; either way the test can restart it and
    hold requests to it (`trainer_gate`)."""
    data_dir = tmp_path / "data"
    gate, trainer_gate = Gate("/v1/gc"), Gate("")
    modelstate = create_modelstate(
        ModelStateSettings(data_dir=data_dir, database_url=database_url, modelstate_gc_interval_s=0)
    )
    modelstate.add_middleware(GateMiddleware, gate=gate)
    worker_vars = {
        "LOOM_WORKER_HEARTBEAT_S": str(HEARTBEAT_S),
        "LOOM_WORKER_CONCURRENCY": "1",
        "LOOM_WORKER_RETRY_BACKOFF_S": "0.2",
        **broker,
    }
    with contextlib.ExitStack() as running:
        modelstate_url = running.enter_context(serve_in_thread(modelstate))

        def trainer_app() -> FastAPI:
            app = (
                create_trainer(
                    TrainerSettings(
                        data_dir=data_dir,
                        modelstate_url=modelstate_url,
                        trainer_device="cpu",
                    )
                )
                if real_trainer
                else trainer_stand_in()
            )
            app.add_middleware(GateMiddleware, gate=trainer_gate)
            return app

        trainer = RestartableServer(trainer_app)
        trainer_url = trainer.start()
        running.callback(trainer.stop)
        shared = {
            "data_dir": data_dir,
            "database_url": database_url,
            "modelstate_url": modelstate_url,
            "trainer_url": trainer_url,
        }
        worker_settings = WorkerSettings(
            **shared,
            **{key.removeprefix("LOOM_").lower(): value for key, value in worker_vars.items()},
        )
        url = running.enter_context(
            serve_in_thread(create_app(GatewaySettings(**shared), worker_settings))
        )
        stack = TaskStack(
            url=url,
            admin_key=(data_dir / "admin_key").read_text().strip(),
            database_url=database_url,
            modelstate_url=modelstate_url,
            data_dir=data_dir,
            base_model=tiny_model_dir,
            gate=gate,
            trainer=trainer,
            trainer_gate=trainer_gate,
            worker_env={
                **os.environ,
                "LOOM_DATA_DIR": str(data_dir),
                "LOOM_DATABASE_URL": database_url,
                "LOOM_MODELSTATE_URL": modelstate_url,
                "LOOM_TRAINER_URL": trainer_url,
                "LOOM_GATEWAY_URL": url,
                "PYTHONUNBUFFERED": "1",
                **worker_vars,
            },
        )
        try:
            yield stack
        finally:
            gate.opened.set()
            trainer_gate.opened.set()
            for worker in stack.workers:
                worker.stop()

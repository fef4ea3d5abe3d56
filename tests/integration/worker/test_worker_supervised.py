"""`loom up`'s supervisor runs the worker too: it counts as ready once it consumes (a file
holding its pid, since it has no port), and stopping leaves no process behind."""

from __future__ import annotations

import time
from pathlib import Path

import httpx2

from cli.supervisor import STACK, Supervisor, group_members
from services.common.ports import free_port
from services.common.settings import LoomSettings
from services.worker.settings import WorkerSettings
from services.worker.startup import is_ready


def test_the_supervisor_starts_a_worker_that_runs_tasks_and_stops_it(tmp_path: Path) -> None:
    settings = LoomSettings(
        data_dir=tmp_path,
        gateway_url=f"http://127.0.0.1:{free_port()}",
        modelstate_url=f"http://127.0.0.1:{free_port()}",
    )
    specs = [spec for spec in STACK if spec.name in ("modelstate", "gateway", "worker")]
    ready_file = WorkerSettings(data_dir=tmp_path).ready_file
    with Supervisor(settings, specs) as supervisor:
        services = {s.name: s for s in supervisor.start()}
        worker = services["worker"]
        assert worker.state == "ready" and worker.url == ""
        assert is_ready(ready_file, worker.pid)
        pool = [p.pid for p in group_members(worker.pid)]
        assert len(pool) >= 2  # the worker and its pool process

        # The embedded default end to end: SQLite and the filesystem broker, no server.
        key = (tmp_path / "admin_key").read_text().strip()
        with httpx2.Client(
            base_url=settings.gateway_url, timeout=30, headers={"Authorization": f"Bearer {key}"}
        ) as http:
            # No trainer runs here: the job is created, then marked failed; it may have tasks.
            refused = http.post("/v1/jobs", json={"base_model": "loom/tiny"})
            assert refused.status_code == 503
            job_id = refused.json()["error"]["detail"]["job_id"]
            task = http.post(f"/v1/jobs/{job_id}/tasks", json={"kind": "gc"}).json()
            deadline = time.monotonic() + 30
            while task["status"] != "succeeded" and time.monotonic() < deadline:
                time.sleep(0.1)
                task = http.get(f"/v1/tasks/{task['id']}").json()
            assert task["status"] == "succeeded", task
    assert all(group_members(s.pid) == [] for s in supervisor.services)
    assert not ready_file.exists()

"""What a service's death costs a running managed run: every service a real process under
`loom up`'s supervisor, an SFT run (LoRA, the tiny model) going on, each service killed with
SIGKILL in turn. Per service: seconds from the kill to the service ready again (the
supervisor's restart, start-up included), and to the run's next checkpoint after the kill;
the run's checkpoint interval before any kill is the baseline in the same run.

    python -m bench.faults

Writes bench/results/faults.md.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx2

from bench._stack import local_stack
from cli.supervisor import SupervisionThread

RESULTS = Path(__file__).parent / "results" / "faults.md"
ORDER = ("trainer", "modelstate", "worker", "reward", "sandbox", "rollout", "gateway")
DATA = [{"input_ids": list(range(3, 3 + 24)), "loss_mask": [0] * 4 + [1] * 20}] * 4
EVERY = 10


def progress(http: httpx2.Client, task_id: str) -> int:
    try:
        seen = http.get(f"/v1/tasks/{task_id}").json()
    except httpx2.TransportError:  # the gateway itself is being restarted
        return -1
    return int((seen.get("progress") or {}).get("step", 0))


def wait_for(condition, timeout_s: float = 600) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError("gave up waiting")
        time.sleep(0.1)
    return time.monotonic()


def main() -> None:
    rows = []
    with (
        tempfile.TemporaryDirectory() as work,
        local_stack(Path(work)) as stack,
        SupervisionThread(stack.supervisor) as kept,
        httpx2.Client(
            base_url=stack.settings.url_of("gateway"),
            timeout=30,
            headers={"Authorization": f"Bearer {stack.api_key}"},
        ) as http,
    ):
        job = http.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "lora"}).json()
        task = http.post(
            f"/v1/jobs/{job['id']}/tasks",
            json={
                "kind": "recipe",
                "params": {
                    "recipe": "sft",
                    "config": {
                        "data": DATA,
                        "steps": 1_000_000,
                        "checkpoint_every": EVERY,
                        "batch_size": 4,
                        "adam": {"lr": 0.01},
                    },
                },
            },
        ).json()
        marks = []
        for _ in range(6):  # the baseline: checkpoint to checkpoint, nothing killed
            step = max(progress(http, task["id"]), 0)
            marks.append(wait_for(lambda s=step: progress(http, task["id"]) > s))
        interval = statistics.median(b - a for a, b in zip(marks, marks[1:], strict=False))
        for name in ORDER:
            service = kept.service(name)
            step = progress(http, task["id"])
            killed = time.monotonic()
            os.killpg(service.pid, signal.SIGKILL)
            wait_for(lambda s=service: s.state != "ready", 30)
            ready = wait_for(lambda s=service: s.state == "ready")
            resumed = wait_for(lambda s=step: progress(http, task["id"]) > s)
            rows.append((name, ready - killed, resumed - killed))
            assert kept.error is None, kept.error
        http.post(f"/v1/tasks/{task['id']}/cancel")
    lines = [
        "# What a service's death costs a managed run",
        "",
        "`python -m bench.faults`: the whole stack as local processes under `loom up`'s "
        "supervisor (SQLite, the filesystem broker), a LoRA SFT run on the tiny model "
        f"checkpointing every {EVERY} steps; each service SIGKILLed in turn while the run goes "
        "on. *Ready*: from the kill to the restarted service's `/readyz` (the supervisor waits "
        "1 s before a restart). *Next checkpoint*: from the kill to the run's next recorded "
        "checkpoint, looked for once the service is ready again: for services the run does "
        "not call (reward, sandbox, rollout) it goes on meanwhile, so that column repeats the "
        "first. This 2-core machine was shared while it ran.",
        "",
        f"Baseline, nothing killed: a checkpoint every {interval:.2f} s (median of 5).",
        "",
        "| service killed | ready after (s) | next checkpoint after (s) |",
        "|---|---|---|",
        *(f"| {name} | {ready:.1f} | {resumed:.1f} |" for name, ready, resumed in rows),
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

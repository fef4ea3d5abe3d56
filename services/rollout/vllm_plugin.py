"""A vLLM general plugin (entry point `vllm.general_plugins`), loaded by every vLLM process
before it makes its message queues: on CPU, shorten how long a queue reader busy-polls.

After each message, vLLM's engine core and workers spin on their shared-memory queues
(sched_yield) for a second before they sleep on a socket. Between GPU steps that saves a
wake-up; on a CPU machine with a few cores it takes a core from the trainer and every other
service while a step computes and for a second after every request. A CPU step takes
milliseconds, so a wake-up (tens of microseconds) costs little.
"""

from __future__ import annotations

import os
from typing import Any

# Set by the rollout service from LOOM_ROLLOUT_CPU_BUSY_POLL_MS (vLLM's own default: 1000).
BUSY_POLL_ENV = "LOOM_VLLM_CPU_BUSY_POLL_MS"


def register() -> None:
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.platforms import current_platform

    value = os.environ.get(BUSY_POLL_ENV)
    if value is None or not current_platform.is_cpu():
        return
    busy_loop_s = float(value) / 1000
    original = shm_broadcast.SpinCondition

    class ShortSpinCondition(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("busy_loop_s", busy_loop_s)
            super().__init__(*args, **kwargs)

    shm_broadcast.SpinCondition = ShortSpinCondition

"""Run one measurement in a forked child process, so that what it does to the process (a GPU
out of memory, an allocator's cache, a process group, a peak-memory counter) ends with it.

Forked, not spawned: the child has the parent's imports already (torch, transformers: seconds
each time otherwise). The parent must therefore never initialise CUDA itself (a forked child
cannot use a CUDA context it inherits): it only forks, and children read the device.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

OK, OUT_OF_MEMORY, FAILED, TIMED_OUT = "ok", "out of memory", "failed", "timed out"
Outcome = tuple[str, Any]  # (OK, the function's value) or (another status, why)


def forked(function: Callable[..., Any], *args: Any, timeout_s: float, threads: int = 0) -> Outcome:
    """`function(*args)` in a child process (`threads`: its torch threads; 0, torch's
    default); a child still running after `timeout_s` is killed."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, function, args, threads))
    child.start()
    send.close()
    try:
        if not receive.poll(max(timeout_s, 1.0)):
            child.kill()
            return TIMED_OUT, f"killed after {timeout_s:.0f} s"
        try:
            outcome: Outcome = receive.recv()
            return outcome
        except EOFError:  # it died before answering (killed for host memory, say)
            child.join()
            return FAILED, f"the process died (exit code {child.exitcode})"
    finally:
        child.join()
        receive.close()


def _child(
    send: Connection, function: Callable[..., Any], args: tuple[Any, ...], threads: int
) -> None:
    if threads:
        torch.set_num_threads(threads)
    try:
        outcome: Outcome = (OK, function(*args))
    except torch.OutOfMemoryError as exc:
        outcome = (OUT_OF_MEMORY, str(exc).splitlines()[0])
    except Exception as exc:  # noqa: BLE001 - reported in the table, the trace on stderr
        traceback.print_exc()
        outcome = (FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0])
    send.send(outcome)
    send.close()

"""The cores a replica's vLLM engine threads run on (VLLM_CPU_OMP_THREADS_BIND) when several
replicas share one CPU host.

vLLM's own binding (`auto`) picks cores from the host's NUMA layout, the same for every engine
process on the host: replicas side by side all bound the same core and took turns on it. A
replica on CPU takes its cores from, in order:
1. VLLM_CPU_OMP_THREADS_BIND in its environment, as given;
2. LOOM_ROLLOUT_CPU_CORES, an explicit set for this replica (`2-3`);
3. LOOM_ROLLOUT_CPU_CORES_PER_REPLICA > 0: the lowest slot of that many cores no other replica
   on the host holds, among the cores this process may run on (its affinity mask: what a
   container or `taskset` allows). A slot is held by an exclusive lock on a file in a
   directory the host's replicas share (LOOM_ROLLOUT_CPU_SLOTS_DIR), for as long as the
   replica's process lives: the kernel releases it however the process ends, so a replica
   restarted (by Ray, on this host or another) takes a free slot again. More replicas than
   slots share slots, round robin.
Otherwise vLLM's own binding. The engine's ranks (tensor x data parallel) split the set.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import re
import tempfile
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
CORE_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


@dataclass
class CoreSlot:
    """A slot this process holds while `lock` stays open."""

    index: int
    cores: list[int]
    lock: IO[bytes]


def parse_cores(text: str) -> list[int]:
    """`0-3,6` → [0, 1, 2, 3, 6]."""
    if not CORE_LIST.match(text):
        raise ValueError(f"{text!r} is not a list of cores such as '0-3,6'.")
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if last and int(last) < int(first):
            raise ValueError(f"The core range {part!r} runs backwards.")
        cores.update(range(int(first), int(last or first) + 1))
    return sorted(cores)


def format_cores(cores: Sequence[int]) -> str:
    """[0, 1, 2, 3, 6] → `0-3,6`."""
    runs = []
    for _, run in itertools.groupby(enumerate(sorted(cores)), lambda pair: pair[1] - pair[0]):
        numbers = [core for _, core in run]
        runs.append(str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}")
    return ",".join(runs)


def slot_cores(allowed: Sequence[int], per_replica: int, slot: int) -> list[int]:
    """Slot `slot`'s cores: the `slot`-th run of `per_replica` of the `allowed` cores, round
    robin once every run is taken (all of them where there are fewer than `per_replica`)."""
    ordered = sorted(allowed)
    runs = max(len(ordered) // per_replica, 1)
    start = (slot % runs) * per_replica
    return ordered[start : start + per_replica]


def rank_binding(cores: Sequence[int], ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for an engine of `ranks` ranks: `cores` split into that many
    runs, `|` between them."""
    if len(cores) < ranks:
        raise ValueError(
            f"{len(cores)} core(s) ({format_cores(cores)}) cannot serve an engine "
            f"of {ranks} ranks (tensor x data parallel size): give each rank one."
        )
    share = len(cores) // ranks
    return "|".join(format_cores(cores[rank * share : (rank + 1) * share]) for rank in range(ranks))


def claim_slot(directory: Path, allowed: Sequence[int], per_replica: int) -> CoreSlot:
    """Hold the lowest slot no other process holds."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in itertools.count():
        lock = (directory / f"slot-{index}.lock").open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return CoreSlot(index, slot_cores(allowed, per_replica, index), lock)
    raise AssertionError("unreachable: itertools.count() does not end")


def default_slots_dir() -> Path:
    return Path(tempfile.gettempdir()) / "loom-rollout-cores"


def bind_engine_threads(
    *,
    explicit: str | None,
    per_replica: int,
    ranks: int,
    slots_dir: Path | None,
    environ: MutableMapping[str, str] = os.environ,
) -> CoreSlot | None:
    """Set VLLM_CPU_OMP_THREADS_BIND in `environ` (read by the engine processes vLLM starts)
    by the rules above; the slot held, if one was claimed (keep it for the process's life)."""
    if BIND_ENV in environ:
        log.info("engine threads bound as %s=%s says", BIND_ENV, environ[BIND_ENV])
        return None
    slot = None
    if explicit is not None:
        cores = parse_cores(explicit)
    elif per_replica > 0:
        slot = claim_slot(
            slots_dir or default_slots_dir(), sorted(os.sched_getaffinity(0)), per_replica
        )
        cores = slot.cores
    else:
        return None
    environ[BIND_ENV] = rank_binding(cores, ranks)
    log.info(
        "engine threads bound to cores %s%s",
        environ[BIND_ENV],
        "" if slot is None else f" (slot {slot.index} of this host's replicas)",
    )
    return slot

"""One rank of a sharded trainer: a process started by the coordinator (`ranks.RankGroup`),
or on another host by its node agent (`node`), which joins the process group and runs every
command the coordinator sends, in order, on its own `ModelRegistry` of sharded models
(`python -m services.trainer.distributed.rank`)."""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import AuthenticationError, Connection
from typing import Any

import torch
import torch.distributed as dist

from services.common.errors import LoomError
from services.common.service_token import service_token
from services.trainer import checkpoints
from services.trainer.distributed import channel
from services.trainer.distributed.commands import CHANNEL_ENV, RANK_ENV, REFUSED, RankConfig
from services.trainer.distributed.sharding import Sharded
from services.trainer.model import resolve_device
from services.trainer.registry import ModelRegistry
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)

# How long a rank of another host tries to reach a coordinator that is not listening.
CONNECT_TIMEOUT_S = 300.0

# What a "run" command may run on a model (a checkpoint's files are written by every rank).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "write_checkpoint": checkpoints.write_checkpoint,
    "read_checkpoint": checkpoints.read_checkpoint,
}


def join(rank: int, config: RankConfig) -> torch.device:
    """Joins the group (gloo on CPU, NCCL on GPU, every collective bounded by the timeout)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{config.master_addr}:{config.master_port}",
        rank=rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.timeout_s),
    )
    return device


def execute(registry: ModelRegistry, command: tuple[Any, ...]) -> Any:
    """("create", spec) -> (info, created, vocab size, max length); ("call", model id,
    method, args) -> what the model's method returns; ("run", model id, function, args) ->
    what `FUNCTIONS[function](model, *args)` returns."""
    if command[0] == "create":
        model, created = registry.create(command[1])
        return model.info(), created, model.vocab_size, model.max_length
    kind, model_id, name, args = command
    model = registry.get(model_id)
    if kind == "run":
        return FUNCTIONS[name](model, *args)
    return getattr(model, name)(*args)


def serve(conn: Connection, registry: ModelRegistry) -> None:
    busy = threading.Event()
    threading.Thread(target=leave_if_abandoned, args=(conn, busy), daemon=True).start()
    while True:
        try:
            command = conn.recv()
        except EOFError:  # the coordinator is gone
            return
        if command is None:
            return
        busy.set()
        try:
            reply = ("ok", execute(registry, command))
        except LoomError as exc:
            reply = ("error", (type(exc), exc.message, exc.detail))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator, which raises it
            reply = ("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        busy.clear()  # before the reply: the coordinator may close the channel once it has it
        conn.send(reply)


def leave_if_abandoned(conn: Connection, busy: threading.Event) -> None:
    """Exits at once when the coordinator closes the channel while a command runs (it gave up
    on the group, or died): the coordinator kills the ranks of its own host, but not those of
    other hosts, which would otherwise wait out a collective with a dead peer (NCCL waits for
    the timeout) before their node agent can start them again. Idle, the rank reads the close
    itself and leaves."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP)
    poller.poll()
    if busy.is_set():
        os._exit(1)


def connect(rank: int) -> Connection:
    """The channel to the coordinator: inherited from it on its host; from another host
    through its listener (`LOOM_TRAINER_COORDINATOR`), with the service token."""
    if CHANNEL_ENV in os.environ:
        return Connection(int(os.environ[CHANNEL_ENV]))
    settings = TrainerSettings()
    assert settings.trainer_coordinator is not None  # the node agent checked its settings
    key = channel.authkey(service_token(settings))
    address = channel.parse_address(settings.trainer_coordinator)
    try:
        return channel.connect(address, key, rank, time.monotonic() + CONNECT_TIMEOUT_S)
    except AuthenticationError as exc:
        log.error(
            "The trainer at %s refused rank %d (%s): give this host the trainer's service "
            "token (LOOM_SERVICE_TOKEN or LOOM_SERVICE_TOKEN_FILE).",
            settings.trainer_coordinator,
            rank,
            exc,
        )
        sys.exit(REFUSED)


def main() -> None:
    rank = int(os.environ[RANK_ENV])
    conn = connect(rank)
    config: RankConfig = conn.recv()
    device = join(rank, config)
    registry = ModelRegistry(
        config.data_dir, device, config.micro_batch_tokens, parallel=Sharded(config.sharding)
    )
    conn.send(("ok", None))
    try:
        serve(conn, registry)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

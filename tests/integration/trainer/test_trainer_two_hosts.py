"""A sharded trainer whose ranks span two "hosts" on 127.0.0.1: the trainer's group (as the app
builds it from LOOM_TRAINER_NNODES=2) runs rank 0, a node agent process
(`python -m services.trainer.distributed.node`) runs rank 1, which joins through the trainer's
authenticated listener and torch's rendezvous."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import AuthenticationError
from pathlib import Path

import psutil
import pytest
import torch
from sharded_support import CONFIGS, MICRO_BATCH_TOKENS, one_step, pair, train_alongside
from sharded_support import uneven_data as data_of

from services.trainer.app import rank_group
from services.trainer.distributed import channel
from services.trainer.distributed.commands import REFUSED
from services.trainer.distributed.ranks import RankFailed
from services.trainer.distributed.remote import RemoteRegistry
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import CreateModelRequest, TrainingMode
from services.trainer.settings import TrainerSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The trainer's settings; a node agent's add its node rank."""
    return {
        "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("trainer")),  # as if shared by both hosts
        "LOOM_SERVICE_TOKEN": secrets.token_hex(16),
        "LOOM_TRAINER_DEVICE": "cpu",
        "LOOM_TRAINER_WORLD_SIZE": "2",
        "LOOM_TRAINER_NNODES": "2",
        "LOOM_TRAINER_COORDINATOR": f"127.0.0.1:{free_port()}",
        "LOOM_TRAINER_RENDEZVOUS": f"127.0.0.1:{free_port()}",
        "LOOM_TRAINER_MICRO_BATCH_TOKENS": str(MICRO_BATCH_TOKENS),
        "LOOM_TRAINER_COLLECTIVE_TIMEOUT_S": "60",
    }


def node_agent(environment: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.trainer.distributed.node"],
        env={**os.environ, **environment, "LOOM_TRAINER_NODE_RANK": "1"},
    )


@pytest.fixture(scope="module")
def two_hosts(environment: dict[str, str]) -> Iterator[RemoteRegistry]:
    settings = TrainerSettings(
        **{name.removeprefix("LOOM_").lower(): value for name, value in environment.items()}
    )
    group = rank_group(settings)
    agent = node_agent(environment)
    try:
        group.start()
        yield RemoteRegistry(group)
    finally:
        group.stop()
        agent.terminate()
        agent.wait(timeout=30)


def test_ranks_on_two_hosts_train_as_one_process(
    two_hosts: RemoteRegistry, tmp_path: Path, tiny_model_dir: Path
) -> None:
    one_process = ModelRegistry(tmp_path, torch.device("cpu"), MICRO_BATCH_TOKENS)
    sharded, single = pair(two_hosts, one_process, "two-hosts", tiny_model_dir)
    train_alongside(sharded, single, CONFIGS[0])


def test_a_rank_without_the_token_is_refused(
    two_hosts: RemoteRegistry, environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node agent with another token stops (code 2) instead of starting its rank again and
    again; another key is refused before anything is unpickled; a peer that connects and says
    nothing is dropped after the handshake's timeout. None joins."""
    listener = two_hosts.group.listener
    assert listener is not None
    impostor = node_agent({**environment, "LOOM_SERVICE_TOKEN": secrets.token_hex(16)})
    assert impostor.wait(timeout=300) == REFUSED
    wrong = channel.authkey(secrets.token_hex(16))
    with pytest.raises(AuthenticationError):
        channel.connect(listener.address, wrong, 1, time.monotonic() + 10)
    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT_S", 0.5)
    with socket.create_connection(listener.address, timeout=10) as silent:
        received = b""
        while chunk := silent.recv(1024):  # the challenge, then the end of the connection
            received += chunk
    assert b"#CHALLENGE#" in received
    assert listener.joined.empty()


def test_a_remote_rank_killed_fails_the_operation_and_the_trainer_works_after(
    two_hosts: RemoteRegistry, tiny_model_dir: Path
) -> None:
    """Rank 1 (the other host's) killed: the next operation fails naming it; the node agent
    starts it again, the group forms again and the model is back at its base."""
    data = data_of()
    model, _ = two_hosts.create(
        CreateModelRequest(
            job_id="remote-killed", base_model=str(tiny_model_dir), mode=TrainingMode.full
        )
    )
    one_step(model, data)
    local = set(two_hosts.group.pids)
    remote = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in local and "services.trainer.distributed.rank" in p.cmdline()
    ]
    assert len(remote) == 1
    remote[0].send_signal(signal.SIGKILL)
    remote[0].wait(timeout=10)
    with pytest.raises(RankFailed, match="rank 1 of 2 failed during forward") as failed:
        model.forward(data)
    assert "another host" in str(failed.value)
    assert model.step == 0
    assert one_step(model, data)[1] > 0
    assert model.step == 1

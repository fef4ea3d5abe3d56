"""A sharded trainer's settings for ranks on several hosts and for CPU offload: what is refused
(with what to set instead), which ranks each host runs, and what FSDP2 is asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch.distributed.fsdp import CPUOffloadPolicy

from services.trainer.app import create_app
from services.trainer.distributed.channel import authkey, parse_address
from services.trainer.distributed.sharding import Sharding, shard_options
from services.trainer.settings import TrainerSettings

TWO_HOSTS = {
    "trainer_world_size": 4,
    "trainer_nnodes": 2,
    "trainer_coordinator": "10.0.0.1:29500",
    "trainer_rendezvous": "10.0.0.1:29400",
}


def test_each_host_runs_its_share_of_the_ranks() -> None:
    settings = TrainerSettings(**TWO_HOSTS)
    assert settings.ranks_of_node(0) == range(0, 2)
    assert settings.ranks_of_node(1) == range(2, 4)
    assert TrainerSettings(trainer_world_size=3).ranks_of_node(0) == range(3)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trainer_world_size": 3}, "must be a multiple of LOOM_TRAINER_NNODES"),
        ({"trainer_node_rank": 2}, "must be below LOOM_TRAINER_NNODES"),
        ({"trainer_coordinator": None}, "needs LOOM_TRAINER_COORDINATOR"),
        ({"trainer_rendezvous": None}, "LOOM_TRAINER_RENDEZVOUS on its own host"),
        ({"trainer_coordinator": "10.0.0.1"}, "is not host:port"),
        ({"trainer_rendezvous": "host:99999"}, "is not host:port"),
    ],
)
def test_a_bad_topology_is_refused_saying_what_to_set(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainerSettings(**{**TWO_HOSTS, **changes})


def test_a_node_agent_needs_no_rendezvous() -> None:
    """Its ranks are told the rendezvous by the trainer."""
    TrainerSettings(**{**TWO_HOSTS, "trainer_rendezvous": None, "trainer_node_rank": 1})


def test_addresses() -> None:
    assert parse_address("[::1]:8") == ("::1", 8)
    assert parse_address("trainer.internal:29500") == ("trainer.internal", 29500)


def test_the_channel_key_is_not_the_token() -> None:
    token = "t" * 32
    assert authkey(token) == authkey(token) != token.encode()
    assert authkey(token) != authkey("u" * 32)


def test_cpu_offload_is_refused_on_a_cpu_trainer() -> None:
    with pytest.raises(ValidationError, match="needs a CUDA device"):
        TrainerSettings(trainer_cpu_offload=True, trainer_device="cpu")


@pytest.mark.parametrize(
    "changes",
    [
        {"trainer_precision": "bf16"},
        {"trainer_activation_checkpointing": True},
        {"trainer_cpu_offload": True, "trainer_device": "cuda"},
        {"trainer_world_size": 2},
    ],
    ids=["bf16", "checkpointing", "offload", "two ranks"],
)
def test_what_only_fsdp2_does_runs_in_ranks_even_at_world_size_1(
    changes: dict[str, object],
) -> None:
    """bf16, activation checkpointing and offload are FSDP2's: at world size 1 they run in a
    one-rank group instead of being ignored by the in-process fp32 trainer."""
    assert TrainerSettings(**changes).sharded  # type: ignore[arg-type]
    assert not TrainerSettings().sharded


def test_cpu_offload_asks_fsdp2_to_offload_every_unit() -> None:
    """Layers and root alike; without the setting no offload policy is passed (FSDP2's
    default: none)."""
    for root in (False, True):
        options = shard_options(Sharding(cpu_offload=True), root=root)
        assert isinstance(options["offload_policy"], CPUOffloadPolicy)
        assert "offload_policy" not in shard_options(Sharding(), root=root)
    assert (
        shard_options(Sharding(precision="bf16"), root=True)["mp_policy"].output_dtype is not None
    )
    assert shard_options(Sharding(precision="bf16"), root=False)["mp_policy"].output_dtype is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="'auto' finds a GPU here")
async def test_cpu_offload_on_a_trainer_that_finds_no_gpu_does_not_start(tmp_path: Path) -> None:
    settings = TrainerSettings(data_dir=tmp_path, trainer_world_size=2, trainer_cpu_offload=True)
    app = create_app(settings)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        async with app.router.lifespan_context(app):
            pass

"""Trainer settings (`LOOM_TRAINER_*`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.common.settings import LoomSettings


class TrainerSettings(LoomSettings):
    trainer_threads: int = Field(
        default=1,
        ge=0,
        description="torch intra-op threads (torch.set_num_threads). The default of 1 suits the "
        "embedded setup, where the trainer shares a small machine with the rollout engine and "
        "each gets a core (as a cluster gives each its own GPU); raise it on a dedicated "
        "trainer host. 0 leaves torch's own choice (one per physical core).",
    )
    trainer_device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="'auto' picks cuda when available, else cpu; or 'cpu', 'cuda', 'cuda:N'.",
    )
    trainer_shard_mb: int = Field(
        default=64,
        ge=1,
        description="Full weights are saved as safetensors shards of at most this size (a "
        "bigger tensor gets a shard of its own): the store hashes and syncs a version's shards "
        "in parallel, and stores a shard whose tensors did not change once.",
    )
    trainer_checkpoint_dir: Path = Field(
        default_factory=lambda data: Path(data["data_dir"]) / "trainer-checkpoints",
        description="Where save_state writes trainer checkpoints (weights, optimizer moments, "
        "step) to resume from after a restart. Default: <data_dir>/trainer-checkpoints.",
    )
    trainer_work_dir: Path = Field(
        default_factory=lambda data: Path(data["data_dir"]) / "trainer",
        description="Scratch space for weights being published. Default: <data_dir>/trainer.",
    )

"""Rollout settings: `LOOM_ROLLOUT_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from services.common.base_models import TINY_MODEL
from services.common.settings import LoomSettings

MiB, GiB = 1 << 20, 1 << 30
# The tiny model's K and V take 2 KiB a token (4 layers x 2 KV heads x 32 dims x 2 x 4 bytes):
# 64 MiB holds a 16 x 8 GRPO batch of short rows twice over, and max_model_len rows 64 at once.
TINY_MODEL_KV_CACHE_BYTES = 64 * MiB


class RolloutSettings(LoomSettings):
    rollout_model: str = Field(
        default=TINY_MODEL, description="Base model: `loom/tiny`, a local directory or a hub name."
    )
    rollout_dtype: str = Field(default="float32", description="float32 on CPU; bfloat16 on GPU.")
    rollout_max_model_len: int = Field(default=512, ge=16)
    rollout_kv_cache_gib: float | None = Field(
        default=None,
        description="KV cache on CPU, in GiB; a fraction sizes it in MiB for small models "
        "(0.0625 = 64 MiB), at least 1 MiB. Default: 64 MiB for `loom/tiny` (32k tokens of "
        "that model: 256 of vLLM's 128-token CPU blocks), 1 GiB for any other model. The "
        "engine fills all of it at start-up: at 1 GiB, the tiny model's vLLM worker held "
        "1.8 GB RSS, at 64 MiB 0.8 GB. An engine given less than one max_model_len sequence "
        "needs fails to start (its log says how much it needs). Unused on GPU (see "
        "rollout_gpu_memory_utilization).",
    )
    rollout_cpu_busy_poll_ms: float = Field(
        default=20.0,
        ge=1,
        description="On CPU, how long vLLM's engine processes busy-poll their queues after a "
        "message before they sleep (vLLM's default, 1000, keeps a core busy for a second after "
        "every request). At least 1: at 0 a sleeping queue reader missed its wake-up, and a "
        "1-token sample took 5 s (vLLM's re-check interval). 2, 5 and 20 made no measurable "
        "difference to a hand-off or to sampling (bench/results/busy_poll.md).",
    )
    rollout_inflight_kv: Literal["keep", "recompute"] = Field(
        default="keep",
        description="When full weights move under running generations (partial rollouts): "
        "`keep` continues them on their KV cache so far (computed by the old weights, as "
        "PipelineRL does; no recomputation), `recompute` recomputes their tokens so far with the "
        "new weights first. Tokens carry the weights that sampled them either way.",
    )
    rollout_max_loras: int = Field(
        default=4,
        ge=0,
        description="LoRA adapters kept resident. 0: an engine without LoRA layers, for a Loom "
        "that trains only full weights (they slow every token, adapter or not: 1.14-1.26x "
        "more tokens/s without them on CPU, bench/results/lora_layers.md); LoRA versions are "
        "then refused.",
    )
    rollout_max_lora_rank: int = Field(default=64, ge=1)
    rollout_enforce_eager: bool = Field(
        default=True, description="Skip graph compilation: faster start-up on CPU."
    )
    rollout_cache_dir: Path | None = Field(
        default=None,
        description="Where versions from a remote store are copied. "
        "Default: <data_dir>/rollout-cache.",
    )
    rollout_seed: int = 0
    rollout_tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="GPUs one engine shards each layer over (vLLM's tensor "
        "parallelism, inside one node).",
    )
    rollout_data_parallel_size: int = Field(
        default=1,
        ge=1,
        description="Engine copies inside this replica (vLLM's data "
        "parallelism); replicas on other hosts are separate rollout processes.",
    )
    rollout_gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of each GPU's memory vLLM may take "
        "(weights, activations, KV cache); unused on CPU (see rollout_kv_cache_gib).",
    )
    rollout_cpu_cores: str | None = Field(
        default=None,
        pattern=r"^\d+(-\d+)?(,\d+(-\d+)?)*$",
        description="CPU only: the cores this replica's engine threads run on (`2-3`), split "
        "among its ranks (sets VLLM_CPU_OMP_THREADS_BIND; that variable, if set, wins). "
        "Unset: see rollout_cpu_cores_per_replica.",
    )
    rollout_cpu_cores_per_replica: int = Field(
        default=0,
        ge=0,
        description="CPU only, several replicas on one host: each takes the lowest free slot "
        "of this many of the cores it may run on, held by a lock in rollout_cpu_slots_dir "
        "while it lives, so no two engines bind the same cores (`loom cluster` sets it from "
        "--rollout-cpus). 0: vLLM's own binding, the same cores for every replica on a host.",
    )
    rollout_cpu_slots_dir: Path | None = Field(
        default=None,
        description="Where the replicas of one host hold their core slots (a "
        "directory they all see: containers on one host mount the same one). Default: "
        "<temp dir>/loom-rollout-cores.",
    )
    rollout_store_local_reads: bool = Field(
        default=True,
        description="Read a version's files where the store keeps them when that "
        "directory is on this host (no copy). False: copy them into rollout_cache_dir from a "
        "replica that holds the version, else from the store, as a replica on another host "
        "does.",
    )
    rollout_announce: bool = Field(
        default=True,
        description="Register with the gateway (LOOM_GATEWAY_URL) and heartbeat, "
        "so it routes to this replica by its versions and load.",
    )
    rollout_heartbeat_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="Heartbeat interval; the gateway drops a replica "
        "after LOOM_GATEWAY_REPLICA_MISSED_HEARTBEATS of them.",
    )
    rollout_replica_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
        description="This replica's name in the gateway's table. Default: host:port of "
        "LOOM_ROLLOUT_URL, which is also the URL it announces.",
    )

    @field_validator("rollout_kv_cache_gib")
    @classmethod
    def _at_least_a_mib(cls, value: float | None) -> float | None:
        if value is not None and not value * GiB >= MiB:  # `not >=` also refuses NaN
            raise ValueError(
                f"LOOM_ROLLOUT_KV_CACHE_GIB must be at least 1 MiB ({MiB / GiB}); got {value}."
            )
        return value

    @property
    def kv_cache_bytes(self) -> int:
        """The CPU KV cache's size (vLLM's `kv_cache_memory_bytes`)."""
        if self.rollout_kv_cache_gib is not None:
            return int(self.rollout_kv_cache_gib * GiB)
        return TINY_MODEL_KV_CACHE_BYTES if self.rollout_model == TINY_MODEL else GiB

    @property
    def cache_dir(self) -> Path:
        return self.rollout_cache_dir or self.data_dir / "rollout-cache"

    @property
    def replica_id(self) -> str:
        host, port = self.bind_of("rollout")
        return self.rollout_replica_id or f"{host}:{port}"

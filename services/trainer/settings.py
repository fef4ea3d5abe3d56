"""Trainer settings (`LOOM_TRAINER_*`)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator

from services.common.settings import LoomSettings
from services.trainer.distributed.channel import parse_address
from services.trainer.page_reserve import DEFAULT_MAX_BYTES

# Padded tokens per forward pass, by device type: big enough that a pass is not dominated by
# its fixed cost, small enough that short rows are not padded to long ones (see
# `batch.micro_batches`) and that each pass's [rows, tokens, vocab] logits and their gradient
# fit. A GPU pass costs far more fixed time and computes padding cheaply: on an H200 (0.5B
# model, bench/results/trainer_cuda.md) 8192 was the fastest budget on both an even and a
# long-tailed batch, 1024 was 2.2-3.4x slower, and 16384 padded more and doubled peak memory.
DEFAULT_MICRO_BATCH_TOKENS = {"cpu": 1024, "cuda": 8192}

CPU_OFFLOAD_NEEDS_GPU = (
    "LOOM_TRAINER_CPU_OFFLOAD keeps the trainer's weights, gradients and optimizer state in "
    "CPU memory while the GPU computes: it needs a CUDA device (on a CPU trainer everything "
    "is in CPU memory already). Unset it."
)


class TrainerSettings(LoomSettings):
    trainer_threads: int = Field(
        default=1,
        ge=0,
        description="torch intra-op threads (torch.set_num_threads). The default of 1 suits the "
        "embedded setup, where the trainer shares a small machine with the rollout engine and "
        "each gets a core (as a cluster gives each its own GPU); raise it on a dedicated "
        "trainer host. 0 leaves torch's own choice (one per physical core). On 2 cores a "
        "thread per core made the tiny model's forward_backward of a 16x8 GRPO batch 1.5x "
        "faster with nothing else running (138 against 212 ms), as a sync loop leaves the "
        "machine, and 16x slower while an engine sampled beside it, as in the async Pipeline "
        "(7.9 s against 0.49): OpenMP's threads spin waiting for a peer the OS has "
        "descheduled. OMP_WAIT_POLICY=PASSIVE stops the collapse and the gain with it "
        "(bench/results/placement.md).",
    )
    trainer_device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="'auto' picks cuda when available, else cpu; or 'cpu', 'cuda', 'cuda:N'.",
    )
    trainer_micro_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="A forward or forward_backward runs its data in micro-batches of rows of "
        "similar length, each at most this many tokens with padding (a longer row goes alone), "
        "so a long-tailed batch does not compute on the padding of its short rows. The loss "
        "and its gradient are the whole batch's either way. Default: "
        f"{DEFAULT_MICRO_BATCH_TOKENS['cpu']} on CPU, {DEFAULT_MICRO_BATCH_TOKENS['cuda']} on "
        "CUDA (a GPU pass has a larger fixed cost and computes padding cheaply).",
    )
    trainer_max_request_tokens: int = Field(
        default=1 << 21,
        ge=1,
        description="Largest forward or forward_backward one request may ask for, in padded "
        "tokens (rows x its longest row: what the trainer allocates for it); more is a 413. "
        "Memory for the passes themselves is bounded by the micro-batch, whatever this is; "
        "split a bigger batch into several forward_backward calls (gradients add up until "
        "optim_step).",
    )
    trainer_keep_series_checkpoints: int = Field(
        default=2,
        ge=2,
        description="Checkpoints kept per series (a managed run saves one each few steps): "
        "older ones are deleted as new ones land. At least 2, so the one a resume may still "
        "point to is never the one deleted. Checkpoints saved without a series stay until "
        "deleted (DELETE /v1/models/{id}/checkpoints/{name}).",
    )
    trainer_tf32: bool = Field(
        default=True,
        description="On CUDA, fp32 matrix products run on TF32 tensor cores (inputs rounded "
        "to 10 mantissa bits, fp32 accumulation): about 3x faster steps for a 0.5B model on "
        "an H200. Weights, gradients and optimizer state stay fp32. false: full fp32 products. "
        "No effect on CPU.",
    )
    trainer_shard_mb: int = Field(
        default=64,
        ge=1,
        description="Full weights are saved as safetensors shards of at most this size (a "
        "bigger tensor gets a shard of its own): the store hashes and syncs a version's shards "
        "in parallel, and stores a shard whose tensors did not change once.",
    )
    trainer_page_reserve_mb: int = Field(
        default=DEFAULT_MAX_BYTES >> 20,
        ge=0,
        description="After each save_weights, keep up to this much clean page cache (per job, "
        "sized like the save) for the job's next save to write into, filled in the background "
        "and reclaimable by the kernel. It makes saves several times faster on VMs that return "
        "free memory to the host (cloud VMs with free page reporting). 0 turns it off.",
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
    trainer_world_size: int = Field(
        default=1,
        ge=1,
        description="Ranks the trainer runs its models on. 1: one process holds each whole "
        "model (fp32 weights, gradients and AdamW moments: 16 bytes per parameter). N > 1: the "
        "trainer starts N rank processes on this host (one per GPU; on CPU as many as set) "
        "that shard each model with FSDP2 (16/N bytes per parameter each, plus the layer "
        "being computed) and split every batch's rows; results equal one process's. LoRA "
        "jobs split the rows too; their shared base is sharded (4/N bytes per parameter "
        "each in fp32), their adapters are whole on every rank.",
    )
    trainer_precision: str = Field(
        default="fp32",
        pattern=r"^(fp32|bf16)$",
        description="Compute precision: 'bf16' runs the layers in bfloat16 with fp32 master "
        "weights, gradient reductions and optimizer state (FSDP2's MixedPrecisionPolicy); "
        "logprobs and losses stay fp32. At world size 1 this runs the model in one rank "
        "process under FSDP2.",
    )
    trainer_activation_checkpointing: bool = Field(
        default=False,
        description="Keep only each layer's input through the forward and recompute the rest "
        "in the backward: activation memory of one layer instead of all, for about a third "
        "more compute. At world size 1 this runs the model in one rank process under FSDP2.",
    )
    trainer_collective_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="A sharded trainer's ranks give up on a collective (waiting on a rank "
        "that died or hangs) after this long; the operation fails naming the rank and the "
        "trainer starts its ranks again.",
    )
    trainer_cpu_offload: bool = Field(
        default=False,
        description="A sharded trainer on GPUs keeps its shards of the fp32 weights, gradients "
        "and AdamW moments in CPU memory and runs the optimizer step there (FSDP2's "
        "CPUOffloadPolicy); a layer's weights are copied to the GPU while it computes. GPU "
        "memory for training state drops to about the layer being computed, for a slower "
        "step (host-device copies, an optimizer step on the CPU). Works at world size 1 too "
        "(one rank process: a model larger than the GPU's memory for its training state). "
        "Refused on a CPU trainer.",
    )
    trainer_nnodes: int = Field(
        default=1,
        ge=1,
        description="Hosts the sharded trainer's ranks span. Each runs "
        "LOOM_TRAINER_WORLD_SIZE / NNODES ranks: the trainer's own host ranks 0.., every "
        "other host a node agent (`python -m services.trainer.distributed.node`, with "
        "LOOM_TRAINER_NODE_RANK). Needs LOOM_TRAINER_RENDEZVOUS and LOOM_TRAINER_COORDINATOR, "
        "the same service token on every host, and the trainer's data, work and checkpoint "
        "directories at the same paths on every host (a shared filesystem).",
    )
    trainer_node_rank: int = Field(
        default=0,
        ge=0,
        description="Which host a node agent is: 1 .. NNODES-1 (0 is the trainer's own host).",
    )
    trainer_rendezvous: str | None = Field(
        default=None,
        description="host:port of torch's rendezvous for ranks on several hosts: a TCPStore "
        "that rank 0, on the trainer's host, serves on that port; give an address of the "
        "trainer's host that the other hosts reach, on a private network (torch's "
        "rendezvous and collectives are not authenticated).",
    )
    trainer_coordinator: str | None = Field(
        default=None,
        description="host:port the trainer listens on (exactly that address) for the command "
        "channels of its ranks on other hosts, and where node agents' ranks connect. A rank "
        "must prove it holds the service token before anything is read from it.",
    )

    @field_validator("trainer_rendezvous", "trainer_coordinator")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)
        return value

    @model_validator(mode="after")
    def _topology(self) -> Self:
        if self.trainer_cpu_offload and self.trainer_device == "cpu":
            raise ValueError(CPU_OFFLOAD_NEEDS_GPU)
        if self.trainer_nnodes == 1:
            return self
        if self.trainer_world_size % self.trainer_nnodes:
            raise ValueError(
                f"LOOM_TRAINER_WORLD_SIZE ({self.trainer_world_size}) must be a multiple of "
                f"LOOM_TRAINER_NNODES ({self.trainer_nnodes}): every host runs as many ranks."
            )
        if self.trainer_node_rank >= self.trainer_nnodes:
            raise ValueError(
                f"LOOM_TRAINER_NODE_RANK ({self.trainer_node_rank}) must be below "
                f"LOOM_TRAINER_NNODES ({self.trainer_nnodes})."
            )
        # A node agent's ranks learn the rendezvous from the trainer.
        if self.trainer_coordinator is None or (
            self.trainer_rendezvous is None and self.trainer_node_rank == 0
        ):
            raise ValueError(
                "A trainer on several hosts (LOOM_TRAINER_NNODES > 1) needs "
                "LOOM_TRAINER_COORDINATOR, and LOOM_TRAINER_RENDEZVOUS on its own host "
                "(host:port each, addresses of the trainer's host that the other hosts reach)."
            )
        return self

    @property
    def sharded(self) -> bool:
        """Whether models run in rank processes under FSDP2: several ranks, or one rank for
        what only FSDP2 does here (bf16 mixed precision, activation checkpointing, CPU
        offload), so those settings hold at world size 1 too instead of being ignored."""
        return (
            self.trainer_world_size > 1
            or self.trainer_precision != "fp32"
            or self.trainer_activation_checkpointing
            or self.trainer_cpu_offload
        )

    def ranks_of_node(self, node: int) -> range:
        """The ranks host `node` runs."""
        per_node = self.trainer_world_size // self.trainer_nnodes
        return range(node * per_node, (node + 1) * per_node)

"""The trainer's ranks on Ray: a placement group `loom-trainer` with one bundle per rank
(`LOOM_TRAINER_WORLD_SIZE`), STRICT_PACK, so that every rank's CPUs and GPUs are reserved on
one node, where the trainer starts its rank processes itself (`services.trainer.distributed`).
The trainer actor sits in bundle 0 with rank 0's share; an idle `RankSlot` actor holds each
other bundle. Ray gives each actor the GPUs of its bundle only, so the slots report theirs and
the trainer's service sees all of them (`CUDA_VISIBLE_DEVICES`).

Ranks on several nodes (STRICT_SPREAD, one node entry point per host joining the trainer's
torch group) are not placed here yet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cli.cluster.actors import RankSlot

PLACEMENT_GROUP = "loom-trainer"
STRATEGY = "STRICT_PACK"
SLOT = "trainer-rank-{rank}"


@dataclass(frozen=True)
class TrainerRanks:
    """How many ranks the trainer runs and what Ray reserves for each."""

    ranks: int = 1
    cpus: float = 1.0  # per rank
    gpus: float = 0.0  # per rank

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"The trainer needs at least one rank (got {self.ranks}).")
        if self.cpus <= 0 and self.gpus <= 0:
            raise ValueError(
                "Each trainer rank needs CPUs or GPUs for Ray to reserve "
                "(--trainer-cpus or --trainer-gpus above 0)."
            )

    def bundle(self) -> dict[str, float]:
        """One rank's bundle (Ray refuses a resource of 0 in a bundle)."""
        return {name: amount for name, amount in (("CPU", self.cpus), ("GPU", self.gpus)) if amount}

    def env(self, gpu_ids: list[str]) -> dict[str, str]:
        """What the trainer's service adds: its world size, and every bundle's GPUs."""
        env = {"LOOM_TRAINER_WORLD_SIZE": str(self.ranks)}
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        return env


def reserve(ranks: TrainerRanks, timeout_s: float) -> Any:
    """The trainer's placement group (the existing one on a second `up`), once Ray placed it."""
    from ray.util.placement_group import get_placement_group, placement_group

    try:
        group = get_placement_group(PLACEMENT_GROUP)
    except ValueError:  # none yet
        group = placement_group(
            [ranks.bundle() for _ in range(ranks.ranks)],
            strategy=STRATEGY,
            name=PLACEMENT_GROUP,
            lifetime="detached",
        )
    if not group.wait(timeout_seconds=timeout_s):
        raise TimeoutError(
            f"Ray could not reserve the trainer's {ranks.ranks} rank(s) on one node within "
            f"{timeout_s:.0f} s: {ranks.bundle()} each ({STRATEGY}); is there a node that "
            "large? (`ray status` shows each node's resources.)"
        )
    return group


def in_bundle(group: Any, index: int) -> dict[str, Any]:
    """Actor options that place an actor in bundle `index` of `group`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        )
    }


def hold_slots(group: Any, ranks: TrainerRanks, namespace: str) -> list[str]:
    """Start a slot actor in each bundle after the first; every slot's GPU ids."""
    import ray

    slot = ray.remote(RankSlot)
    handles = [
        slot.options(
            name=SLOT.format(rank=rank),
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=ranks.cpus,
            num_gpus=ranks.gpus,
            **in_bundle(group, rank),
        ).remote(SLOT.format(rank=rank))
        for rank in range(1, ranks.ranks)
    ]
    return [gpu for ids in ray.get([h.gpu_ids.remote() for h in handles]) for gpu in ids]


def describe() -> dict[str, Any] | None:
    """The placement group as Ray holds it: strategy, state, each bundle and its node."""
    from ray.util.placement_group import get_placement_group, placement_group_table

    try:
        group = get_placement_group(PLACEMENT_GROUP)
    except ValueError:
        return None
    table = placement_group_table(group)
    return {
        "name": PLACEMENT_GROUP,
        "strategy": table["strategy"],
        "state": table["state"],
        "bundles": [table["bundles"][index] for index in sorted(table["bundles"])],
        "nodes": [table["bundles_to_node_id"][index] for index in sorted(table["bundles"])],
    }


def release(namespace: str) -> None:
    """Stop the slots and give the reservation back (after the trainer stopped)."""
    import ray
    from ray.util.placement_group import get_placement_group, remove_placement_group

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == namespace and actor["name"].startswith("trainer-rank-"):
            ray.kill(ray.get_actor(actor["name"], namespace=namespace))
    try:
        remove_placement_group(get_placement_group(PLACEMENT_GROUP))
    except ValueError:
        return

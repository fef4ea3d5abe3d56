"""`loom cluster`: the stack on an existing Ray cluster (see `cli.cluster.placement`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cli.cluster import placement, trainer_group
from cli.cluster.placement import ClusterSpec
from cli.cluster.trainer_group import TrainerRanks
from cli.common import DataDirOption, console, fail
from services.common.settings import LoomSettings

cluster_app = typer.Typer(
    help="Run Loom on a Ray cluster: each service a Ray actor.", no_args_is_help=True
)
AddressOption = Annotated[
    str,
    typer.Option(
        "--address", envvar="RAY_ADDRESS", help="The Ray cluster (host:port of its head)."
    ),
]
DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="LOOM_DATABASE_URL",
        help="The database every service uses (PostgreSQL when nodes do not share a disk).",
    ),
]
CpusOption = Annotated[float, typer.Option(min=0, help="CPUs Ray reserves for each replica.")]
GpusOption = Annotated[
    float,
    typer.Option(
        min=0, help="GPUs Ray reserves for each replica (its tensor x data parallel size)."
    ),
]


def _spec(
    data_dir: Path | None,
    database_url: str | None,
    *,
    rollout_cpus: float = 1.0,
    rollout_gpus: float = 0.0,
    trainer: TrainerRanks | None = None,
) -> ClusterSpec:
    settings = LoomSettings(
        **{
            key: value
            for key, value in (("data_dir", data_dir), ("database_url", database_url))
            if value
        }
    )
    return ClusterSpec(
        settings,
        rollout_cpus=rollout_cpus,
        rollout_gpus=rollout_gpus,
        trainer=trainer or TrainerRanks(),
    )


def _connect(address: str) -> None:
    try:
        placement.connect(address)
    except ImportError as exc:  # Ray is an optional extra
        fail(f"Ray is not installed: pip install 'loom[cluster]' ({exc}).")


@cluster_app.command()
def up(
    address: AddressOption,
    data_dir: DataDirOption = None,
    database_url: DatabaseOption = None,
    rollout_replicas: Annotated[int, typer.Option(min=0)] = 1,
    rollout_cpus: CpusOption = 1.0,
    rollout_gpus: GpusOption = 0.0,
    trainer_ranks: Annotated[
        int,
        typer.Option(
            min=1,
            help="The trainer's ranks (LOOM_TRAINER_WORLD_SIZE), reserved together on one node.",
        ),
    ] = 1,
    trainer_cpus: Annotated[float, typer.Option(min=0, help="CPUs Ray reserves per rank.")] = 1.0,
    trainer_gpus: Annotated[float, typer.Option(min=0, help="GPUs Ray reserves per rank.")] = 0.0,
) -> None:
    """Start the services and N rollout replicas as Ray actors; waits until all are ready."""
    try:
        trainer = TrainerRanks(trainer_ranks, trainer_cpus, trainer_gpus)
    except ValueError as exc:
        fail(str(exc), code=2)
    _connect(address)
    urls = placement.up(
        _spec(
            data_dir,
            database_url,
            rollout_cpus=rollout_cpus,
            rollout_gpus=rollout_gpus,
            trainer=trainer,
        ),
        rollout_replicas,
    )
    console.print(f"Loom is up on Ray at {address}: gateway {urls['gateway']}")
    group = trainer_group.describe()
    if group is not None:
        nodes = ", ".join(sorted({node[:12] for node in group["nodes"]}))
        console.print(
            f"trainer: {len(group['bundles'])} rank(s) in placement group {group['name']} "
            f"({group['strategy']}, {group['state']}) on node {nodes}, "
            f"{trainer.bundle()} each"
        )


@cluster_app.command()
def scale(
    service: Annotated[str, typer.Argument(help="rollout")],
    replicas: Annotated[int, typer.Argument(min=0)],
    address: AddressOption,
    data_dir: DataDirOption = None,
    database_url: DatabaseOption = None,
    rollout_cpus: CpusOption = 1.0,
    rollout_gpus: GpusOption = 0.0,
) -> None:
    """Add or remove rollout replicas while jobs run (a removed one drains first)."""
    if service != "rollout":
        fail(f"Only rollout scales by replicas (got {service!r}).", code=2)
    _connect(address)
    placement.scale(
        _spec(data_dir, database_url, rollout_cpus=rollout_cpus, rollout_gpus=rollout_gpus),
        replicas,
    )
    console.print(f"rollout: {len(placement.rollout_names())} replica(s)")


@cluster_app.command()
def status(address: AddressOption) -> None:
    """Each Loom actor: its URL, node and whether its process runs."""
    _connect(address)
    table = Table("actor", "url", "node", "alive")
    for row in placement.status():
        table.add_row(row["name"], row["url"], row["node_id"][:12], str(row["alive"]))
    console.print(table)


@cluster_app.command()
def down(
    address: AddressOption, data_dir: DataDirOption = None, database_url: DatabaseOption = None
) -> None:
    """Stop every Loom actor (state stays in the database and the data dir)."""
    _connect(address)
    placement.down(_spec(data_dir, database_url))
    console.print("Loom's actors are stopped.")

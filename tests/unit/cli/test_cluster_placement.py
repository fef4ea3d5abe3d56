"""What `loom cluster` asks of Ray, without Ray: actor options, the stack's environment and the
trainer's rank bundles."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.cluster.placement import ClusterSpec, _options, _urls_env
from cli.cluster.trainer_group import TrainerRanks
from cli.main import app
from services.common.settings import LoomSettings


def test_replicas_spread_and_restart_while_other_services_stay_put() -> None:
    replica = _options("rollout-0", 1, 0, restarts=-1, spread=True)
    assert replica["scheduling_strategy"] == "SPREAD" and replica["max_restarts"] == -1
    assert replica["lifetime"] == "detached" and replica["namespace"] == "loom"
    gateway = _options("gateway", 0, 0, restarts=0)
    assert "scheduling_strategy" not in gateway and gateway["max_restarts"] == 0
    # A control call (drain, stop, where) that meets an actor unreachable for a moment is
    # sent again: a scale-down on a busy node failed on the first ActorUnavailableError.
    assert replica["max_task_retries"] > 0 and gateway["max_task_retries"] > 0


def test_the_stack_environment_names_the_data_the_token_and_every_url(tmp_path: Path) -> None:
    spec = ClusterSpec(
        LoomSettings(data_dir=tmp_path, database_url="postgresql+psycopg://db/x"),
        env={"LOOM_ROLLOUT_MODEL": "/m"},
    )
    env = spec.stack_env()
    assert env["LOOM_DATA_DIR"] == str(tmp_path) and env["LOOM_ROLLOUT_MODEL"] == "/m"
    assert env["LOOM_DATABASE_URL"] == "postgresql+psycopg://db/x"
    assert {"LOOM_SERVICE_TOKEN", "LOOM_SERVICE_TOKEN_FILE"} & set(env)  # as the settings say
    urls = _urls_env({"gateway": "http://127.0.0.1:1", "worker": "http://127.0.0.1:2"})
    assert urls == {"LOOM_GATEWAY_URL": "http://127.0.0.1:1"}  # the worker serves no HTTP


def test_replicas_on_cpu_nodes_take_a_core_slot_the_size_of_their_request(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path)
    slot = "LOOM_ROLLOUT_CPU_CORES_PER_REPLICA"
    assert ClusterSpec(settings).replica_env() == {slot: "1"}
    assert ClusterSpec(settings, rollout_cpus=2.5).replica_env() == {slot: "2"}
    assert ClusterSpec(settings, rollout_cpus=0.5).replica_env() == {}  # no whole core
    assert ClusterSpec(settings, rollout_gpus=1).replica_env() == {}  # GPU replicas


def test_trainer_ranks_reserve_one_bundle_each_and_see_every_bundles_gpus() -> None:
    gpu_ranks = TrainerRanks(ranks=4, cpus=8, gpus=1)
    assert gpu_ranks.bundle() == {"CPU": 8, "GPU": 1}
    assert gpu_ranks.env(["2", "3", "4", "5"]) == {
        "LOOM_TRAINER_WORLD_SIZE": "4",
        "CUDA_VISIBLE_DEVICES": "2,3,4,5",
    }
    cpu_ranks = TrainerRanks(ranks=2, cpus=1)
    assert cpu_ranks.bundle() == {"CPU": 1}  # Ray refuses a resource of 0 in a bundle
    assert cpu_ranks.env([]) == {"LOOM_TRAINER_WORLD_SIZE": "2"}
    assert TrainerRanks(cpus=0, gpus=1).bundle() == {"GPU": 1}


def test_a_trainer_rank_with_nothing_to_reserve_is_refused_before_ray_is_asked() -> None:
    with pytest.raises(ValueError, match="--trainer-cpus or --trainer-gpus"):
        TrainerRanks(cpus=0, gpus=0)
    result = CliRunner().invoke(
        app, ["cluster", "up", "--address", "127.0.0.1:1", "--trainer-cpus", "0"]
    )
    assert result.exit_code == 2 and "CPUs or GPUs" in result.output

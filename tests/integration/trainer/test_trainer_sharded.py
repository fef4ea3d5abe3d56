"""The sharded trainer: two rank processes (FSDP2 on CPU, gloo) against one process, on the
same data, step for step."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sharded_support import (
    CONFIGS,
    MICRO_BATCH_TOKENS,
    STEPS,
    one_step,
    pair,
    train_alongside,
    uneven_data,
    weights,
)
from trainer_harness import JOB_FULL, serving

from modelstate.client import ModelStateClient
from services.trainer import checkpoints
from services.trainer.distributed.commands import RankConfig
from services.trainer.distributed.ranks import RankFailed, RankGroup
from services.trainer.distributed.remote import RemoteRegistry
from services.trainer.distributed.sharding import Sharding
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    LossConfig,
    TrainingMode,
)
from services.trainer.settings import TrainerSettings


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteRegistry]:
    """Two ranks, started once for the module (each test makes its own models)."""
    group = RankGroup(
        RankConfig(
            world_size=2,
            master_port=0,
            data_dir=tmp_path_factory.mktemp("ranks"),
            device="cpu",
            micro_batch_tokens=MICRO_BATCH_TOKENS,
            threads=1,
            sharding=Sharding(),
            timeout_s=60,
        )
    )
    group.start()
    try:
        yield RemoteRegistry(group)
    finally:
        group.stop()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    return ModelRegistry(tmp_path_factory.mktemp("one"), torch.device("cpu"), MICRO_BATCH_TOKENS)


@pytest.mark.parametrize(
    ("config", "mode"),
    [
        *[(config, TrainingMode.full) for config in CONFIGS],
        (CONFIGS[0], TrainingMode.lora),
        (CONFIGS[1], TrainingMode.lora),
    ],
    ids=lambda v: v.aggregation.value if isinstance(v, LossConfig) else v.value,
)
def test_two_ranks_train_as_one_process(
    ranks: RemoteRegistry,
    one_process: ModelRegistry,
    tiny_model_dir: Path,
    tmp_path: Path,
    config: LossConfig,
    mode: TrainingMode,
) -> None:
    """PPO with KL to the reference, 3 steps on a batch of uneven rows in micro-batches: the
    same losses, metrics, logprobs, gradient norms and weights (fp32, within 1e-5). LoRA: two
    jobs' adapters on one base on the ranks."""
    job = f"ppo-{config.aggregation.value}-{mode.value}"
    sharded, single = pair(ranks, one_process, job, tiny_model_dir, mode)
    train_alongside(sharded, single, config)
    if mode == TrainingMode.lora:  # the shared base is sharded too: half of it on rank 0
        held = ranks.group.call("call", job, "state_bytes", ())
        whole = single.state_bytes()["frozen"]
        assert whole > 0
        assert 0.45 * whole <= held["frozen"] <= 0.55 * whole
    got_weights = weights(sharded, tmp_path / "sharded")
    want_weights = weights(single, tmp_path / "single")
    assert got_weights.keys() == want_weights.keys()
    for name, tensor in want_weights.items():
        torch.testing.assert_close(got_weights[name], tensor, rtol=0, atol=1e-5, msg=name)


def test_weights_saved_by_two_ranks_are_one_process_weights(
    ranks: RemoteRegistry, one_process: ModelRegistry, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The same files, byte for byte: each rank gathers and writes its share of the shards."""
    sharded, single = pair(ranks, one_process, "publish", tiny_model_dir)
    (tmp_path / "sharded").mkdir()
    (tmp_path / "single").mkdir()
    sharded.save(tmp_path / "sharded", shard_bytes=1 << 20)
    single.save(tmp_path / "single", shard_bytes=1 << 20)
    files = sorted(p.name for p in (tmp_path / "single").iterdir())
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == files
    assert sum(name.endswith(".safetensors") for name in files) > 1
    for name in files:
        assert (tmp_path / "sharded" / name).read_bytes() == (
            tmp_path / "single" / name
        ).read_bytes(), name


@pytest.mark.parametrize("mode", [TrainingMode.full, TrainingMode.lora], ids=str)
@pytest.mark.parametrize("direction", ["2 to 1", "1 to 2"])
def test_a_checkpoint_resumes_at_another_world_size(
    ranks: RemoteRegistry,
    one_process: ModelRegistry,
    tiny_model_dir: Path,
    tmp_path: Path,
    direction: str,
    mode: TrainingMode,
) -> None:
    """Saved (weights, AdamW moments, step) at one world size, loaded at the other: the next
    step gives what the saver's own next step gives. Full weights on ranks go through DCP; a
    LoRA adapter, which every rank holds whole, is rank 0's files."""
    saver_side, loader_side = (0, 1) if direction == "2 to 1" else (1, 0)
    suffix = f"{direction.replace(' ', '')}-{mode.value}"
    savers = pair(ranks, one_process, f"save-{suffix}", tiny_model_dir, mode)
    loaders = pair(ranks, one_process, f"load-{suffix}", tiny_model_dir, mode)
    saver, loader = savers[saver_side], loaders[loader_side]
    data = uneven_data(seed=1)
    one_step(saver, data)
    checkpoints.save_state(saver, tmp_path, "after-1")
    assert (tmp_path / saver.spec.job_id / "after-1" / checkpoints.SHARDED).is_dir() == (
        saver is savers[0] and mode == TrainingMode.full
    )
    checkpoints.load_state(loader, tmp_path, "after-1", job_id=saver.spec.job_id)
    assert loader.step == 1
    got, want = one_step(loader, data), one_step(saver, data)
    assert got == pytest.approx(want, rel=1e-5)
    got_weights = weights(loader, tmp_path / "loader")
    for name, tensor in weights(saver, tmp_path / "saver").items():
        torch.testing.assert_close(got_weights[name], tensor, rtol=0, atol=1e-5, msg=name)


def test_a_rank_killed_mid_operation_fails_it_and_the_models_come_back_at_their_checkpoints(
    ranks: RemoteRegistry, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The operation fails naming the dead rank (no hang); the ranks are started again and
    every model is reloaded from its last checkpoint (weights and AdamW moments: the next
    step is the one taken after the save; a full model's DCP shards, a LoRA adapter's files),
    or is back at its base where it had none; the
    next operation of a model whose client was not told yet fails once, saying so."""
    data = uneven_data()
    model, _ = ranks.create(
        CreateModelRequest(job_id="killed", base_model=str(tiny_model_dir), mode=TrainingMode.full)
    )
    bystander, _ = ranks.create(
        CreateModelRequest(
            job_id="bystander", base_model=str(tiny_model_dir), mode=TrainingMode.full
        )
    )
    adapter, _ = ranks.create(
        CreateModelRequest(
            job_id="killed-lora", base_model=str(tiny_model_dir), mode=TrainingMode.lora
        )
    )
    one_step(model, data)
    one_step(model, data)
    one_step(bystander, data)
    one_step(adapter, data)
    checkpoints.save_state(adapter, tmp_path, "lora-1")
    adapter_saved = adapter.forward(data).logprobs
    one_step(adapter, data)
    checkpoints.save_state(model, tmp_path, "after-2")
    saved = model.forward(data).logprobs
    third = one_step(model, data)
    assert model.step == 3
    group, pids = ranks.group, ranks.group.pids
    big = uneven_data(count=200, seed=2)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            model.forward_backward(big, CONFIGS[0])
        except RankFailed as exc:
            failure.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(1.0)
    os.kill(pids[1], signal.SIGKILL)
    worker.join(timeout=600)
    assert not worker.is_alive()
    assert failure, "the operation in flight should have failed"
    assert "rank 1 of 2" in str(failure[0]) and "forward_backward" in str(failure[0])
    assert "checkpoint 'after-2' (step 2)" in str(failure[0])
    detail = failure[0].detail
    assert (detail["rank"], detail["operation"]) == (1, "forward_backward")
    assert (detail["restored"]["checkpoint"], detail["restored"]["step"]) == ("after-2", 2)
    assert group.pids and set(group.pids).isdisjoint(pids)

    restored = model.info().restored
    assert restored is not None and (restored.checkpoint, restored.step) == ("after-2", 2)
    assert (restored.failed_rank, restored.failed_operation) == (1, "forward_backward")
    assert model.step == model.info().step == 2
    again = model.forward(data).logprobs
    for row, expected in zip(again, saved, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)
    assert one_step(model, data) == pytest.approx(third, rel=1e-5)
    assert model.step == 3

    with pytest.raises(RankFailed, match="bystander is back at its base weights") as told:
        bystander.forward(data)
    assert told.value.detail["restored"]["checkpoint"] is None
    assert bystander.info().restored is not None and bystander.step == 0
    assert one_step(bystander, data)[1] > 0
    assert bystander.step == 1

    with pytest.raises(RankFailed, match=r"killed-lora is back at its checkpoint 'lora-1'"):
        adapter.forward(data)
    assert adapter.step == 1
    for row, expected in zip(adapter.forward(data).logprobs, adapter_saved, strict=True):
        assert row == pytest.approx(expected, abs=1e-5)


def test_an_unreadable_checkpoint_does_not_keep_the_ranks_from_forming_again(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A model's last checkpoint torn on disk: the re-forming that tries it fails, the next
    one brings that model back at its base and says why; the trainer works on."""
    group = RankGroup(
        RankConfig(
            world_size=2,
            master_port=0,
            data_dir=tmp_path / "ranks",
            device="cpu",
            micro_batch_tokens=MICRO_BATCH_TOKENS,
            threads=1,
            sharding=Sharding(),
            timeout_s=30,
        )
    )
    group.start()
    try:
        model, _ = RemoteRegistry(group).create(
            CreateModelRequest(
                job_id="torn", base_model=str(tiny_model_dir), mode=TrainingMode.full
            )
        )
        data = uneven_data()
        one_step(model, data)
        checkpoints.save_state(model, tmp_path / "states", "torn-1")
        shards = [
            p
            for p in (tmp_path / "states" / "torn" / "torn-1").rglob("*")
            if p.is_file() and p.name != "state.json"
        ]
        assert shards
        for shard in shards:
            shard.write_bytes(b"not a checkpoint")
        os.kill(group.pids[1], signal.SIGKILL)
        with pytest.raises(RankFailed, match="rank 1 of 2"):
            model.forward(data)
        with pytest.raises(RankFailed, match="base weights .* its checkpoint 'torn-1'"):
            model.forward(data)
        restored = model.info().restored
        assert restored is not None and restored.checkpoint is None
        assert restored.unreadable_checkpoint is not None
        assert model.step == 0
        assert one_step(model, data)[1] > 0
        assert model.step == 1
    finally:
        group.stop()


def test_bf16_with_activation_checkpointing_trains_near_fp32(
    one_process: ModelRegistry, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """bf16 compute (fp32 master weights, reductions and moments) with activation
    checkpointing: the loss within bf16's rounding of fp32's, falling; weights stay fp32."""
    group = RankGroup(
        RankConfig(
            world_size=2,
            master_port=0,
            data_dir=tmp_path / "bf16",
            device="cpu",
            micro_batch_tokens=MICRO_BATCH_TOKENS,
            threads=1,
            sharding=Sharding(precision="bf16", activation_checkpointing=True),
            timeout_s=60,
        )
    )
    group.start()
    try:
        sharded, single = pair(RemoteRegistry(group), one_process, "bf16", tiny_model_dir)
        data, config = uneven_data(), LossConfig()
        losses = []
        for _ in range(STEPS):
            want = single.forward_backward(data, config).loss
            losses.append(sharded.forward_backward(data, config).loss)
            assert losses[-1] == pytest.approx(want, rel=2e-2)
            single.optim_step(AdamParams(lr=1e-3))
            sharded.optim_step(AdamParams(lr=1e-3))
        assert losses[-1] < losses[0]
        assert {t.dtype for t in weights(sharded, tmp_path / "saved").values()} == {torch.float32}
    finally:
        group.stop()


async def test_the_trainer_service_runs_on_two_ranks(
    tmp_path: Path, tiny_model_dir: Path, modelstate_client: ModelStateClient
) -> None:
    """LOOM_TRAINER_WORLD_SIZE=2 through the HTTP API: the same routes and results, a version
    published from the ranks' files; after a rank dies, the failed operation's error and the
    model's info say which checkpoint the model was reloaded from."""
    settings = TrainerSettings(
        data_dir=tmp_path / "trainer",
        trainer_device="cpu",
        trainer_world_size=2,
        trainer_collective_timeout_s=60,
    )
    async with serving(settings, modelstate_client, tiny_model_dir) as trainer:
        await trainer.create(JOB_FULL, "full")
        data = [d.model_dump(exclude_none=True) for d in uneven_data()]
        result = await trainer.run(JOB_FULL, "forward_backward", {"data": data})
        assert result["loss"] > 0
        assert (await trainer.run(JOB_FULL, "optim_step", {}))["step"] == 1
        saved = await trainer.run(JOB_FULL, "save_weights", {})
        assert saved["number"] == 1 and saved["step"] == 1
        version = await modelstate_client.get_version(JOB_FULL, 1)
        assert any(f.path.endswith(".safetensors") for f in version.files)

        await trainer.run(JOB_FULL, "save_state", {"name": "after-1"})
        saved = (await trainer.run(JOB_FULL, "forward", {"data": data}))["logprobs"]
        await trainer.run(JOB_FULL, "forward_backward", {"data": data})
        await trainer.run(JOB_FULL, "optim_step", {})
        os.kill(trainer.service.registry.group.pids[1], signal.SIGKILL)  # type: ignore[union-attr]
        failed = await trainer.wait(
            (await trainer.submit(JOB_FULL, "forward_backward", {"data": data}))["id"]
        )
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "trainer_rank_failed"
        assert failed["error"]["detail"]["rank"] == 1
        assert failed["error"]["detail"]["restored"]["checkpoint"] == "after-1"
        info = (await trainer.http.get(f"/v1/models/{JOB_FULL}")).json()
        assert info["step"] == 1
        assert (info["restored"]["checkpoint"], info["restored"]["step"]) == ("after-1", 1)
        again = (await trainer.run(JOB_FULL, "forward", {"data": data}))["logprobs"]
        for row, expected in zip(again, saved, strict=True):
            assert row == pytest.approx(expected, abs=1e-5)


async def test_bf16_at_world_size_1_trains_in_a_rank_not_ignored(
    tmp_path: Path,
    tiny_model_dir: Path,
    modelstate_client: ModelStateClient,
    one_process: ModelRegistry,
) -> None:
    """LOOM_TRAINER_PRECISION=bf16 with activation checkpointing on one device: the service
    runs its one rank under FSDP2 (a bf16 loss near fp32's, not equal to it), where it used
    to train in fp32 in process and ignore both settings."""
    settings = TrainerSettings(
        data_dir=tmp_path / "trainer",
        trainer_device="cpu",
        trainer_precision="bf16",
        trainer_activation_checkpointing=True,
        trainer_collective_timeout_s=60,
    )
    async with serving(settings, modelstate_client, tiny_model_dir) as trainer:
        assert len(trainer.service.registry.group.pids) == 1  # type: ignore[union-attr]
        await trainer.create(JOB_FULL, "full")
        data = uneven_data()
        loss = (
            await trainer.run(
                JOB_FULL,
                "forward_backward",
                {"data": [d.model_dump(exclude_none=True) for d in data]},
            )
        )["loss"]
    spec = CreateModelRequest(job_id="fp32-reference", base_model=str(tiny_model_dir))
    fp32 = one_process.create(spec)[0].forward_backward(data, LossConfig()).loss
    assert loss == pytest.approx(fp32, rel=2e-2) and loss != fp32


def test_a_generated_base_is_built_whole_for_ranks(ranks: RemoteRegistry) -> None:
    """`loom/tiny` made for the first time by a sharded trainer: built by the coordinator
    (transformers' save_pretrained writes nothing on a rank other than 0, which left a
    directory marked built without its config and weights whenever rank 1 built it first)."""
    model = ranks.create(CreateModelRequest(job_id="generated-base", base_model="loom/tiny"))[0]
    tiny = ranks.group.config.data_dir / "models" / "tiny"
    assert (tiny / "config.json").is_file() and (tiny / "model.safetensors").is_file()
    assert model.forward_backward(uneven_data(), LossConfig()).loss > 0

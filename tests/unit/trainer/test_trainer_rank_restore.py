"""What a sharded trainer's model does when its ranks were formed again after a failure:
reload its last checkpoint if it still exists, else say it is at its base, and tell its client
once (`RemoteModel`, against a stand-in for the rank group that records the commands; the
real ranks are in tests/integration/trainer/test_trainer_sharded.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from services.trainer.distributed.ranks import RankFailed
from services.trainer.distributed.remote import RemoteModel
from services.trainer.schemas import CreateModelRequest, ModelInfo, TrainingMode

FAILURE = RankFailed(
    "Trainer rank 1 of 2 failed during forward_backward",
    {"rank": 1, "operation": "forward_backward"},
)


class Commands:
    """Records what would run on the ranks; `fail` makes the next call fail as a rank would
    (after the group was formed again)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.fail: Callable[[], None] | None = None

    def call(self, *command: Any, check: Callable[[], None] | None = None) -> Any:
        if check is not None:
            check()
        if self.fail is not None:
            fail, self.fail = self.fail, None
            fail()
        self.sent.append(command)
        return None

    def run(self, command: tuple[Any, ...]) -> None:
        self.sent.append(command)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        yield


def model(commands: Commands, job: str = "job") -> RemoteModel:
    spec = CreateModelRequest(job_id=job, base_model="base", mode=TrainingMode.full)
    info = ModelInfo(
        model_id=job,
        job_id=job,
        base_model="base",
        mode=TrainingMode.full,
        lora=None,
        num_params=10,
        trainable_params=10,
        step=0,
        last_version=0,
    )
    return RemoteModel(commands, spec, info, vocab_size=8, max_length=16)  # type: ignore[arg-type]


def checkpoint(root: Path, job: str, name: str) -> Path:
    directory = root / job / name
    directory.mkdir(parents=True)
    (directory / "state.json").write_text("{}")
    return directory


def test_a_model_comes_back_at_its_last_checkpoint_and_its_client_is_told_once(
    tmp_path: Path,
) -> None:
    commands = Commands()
    m = model(commands)
    m.step, m.last_version = 2, 1
    m.wrote_checkpoint(checkpoint(tmp_path, "job", "after-2"), optimizer=True)
    m.step, m.last_version = 5, 3  # trained and published since

    m.restore(commands.run, FAILURE)
    assert commands.sent[-1] == (
        "run",
        "job",
        "read_checkpoint",
        (tmp_path / "job" / "after-2", True, 2, 1),
    )
    info = m.info()
    assert (info.step, info.last_version) == (2, 1)
    assert info.restored is not None
    assert (info.restored.checkpoint, info.restored.step) == ("after-2", 2)
    assert (info.restored.failed_rank, info.restored.failed_operation) == (1, "forward_backward")
    assert info.restored.checkpoint_job_id is None

    sent = len(commands.sent)
    with pytest.raises(RankFailed, match=r"checkpoint 'after-2' \(step 2\)") as told:
        m.forward([])
    assert told.value.detail["restored"]["checkpoint"] == "after-2"
    assert len(commands.sent) == sent, "the operation it refused must not run"
    m.forward([])  # told: the next one runs
    assert commands.sent[-1][:3] == ("call", "job", "forward")


def test_a_model_whose_checkpoint_is_gone_comes_back_at_its_base(tmp_path: Path) -> None:
    commands = Commands()
    m = model(commands)
    m.step = 4
    directory = checkpoint(tmp_path, "job", "old")
    m.wrote_checkpoint(directory, optimizer=True)
    (directory / "state.json").unlink()  # deleted since

    m.restore(commands.run, FAILURE)
    assert commands.sent == []
    assert m.step == 0
    assert m.restored is not None and m.restored.checkpoint is None
    with pytest.raises(RankFailed, match="back at its base weights"):
        m.optim_step(None)  # type: ignore[arg-type]


def test_another_jobs_checkpoint_is_named_with_its_job(tmp_path: Path) -> None:
    commands = Commands()
    m = model(commands)
    m.read_checkpoint(checkpoint(tmp_path, "other", "warm"), False, 7, None)
    m.restore(commands.run, FAILURE)
    assert commands.sent[-1] == (
        "run",
        "job",
        "read_checkpoint",
        (tmp_path / "other" / "warm", False, 7, None),
    )
    assert m.restored is not None
    assert (m.restored.checkpoint, m.restored.checkpoint_job_id) == ("warm", "other")


def test_the_failed_operations_error_says_where_its_model_is_and_tells_it(tmp_path: Path) -> None:
    commands = Commands()
    m = model(commands)
    m.wrote_checkpoint(checkpoint(tmp_path, "job", "c"), optimizer=False)

    def fail() -> None:  # as `RankGroup.call` does: re-form (restore), then raise
        m.restore(commands.run, FAILURE)
        raise FAILURE

    commands.fail = fail
    with pytest.raises(RankFailed, match=r"rank 1 of 2.*checkpoint 'c' \(step 0\)") as failed:
        m.forward_backward([], None)  # type: ignore[arg-type]
    assert failed.value.detail == {
        "rank": 1,
        "operation": "forward_backward",
        "restored": m.restored.model_dump(mode="json"),
    }  # type: ignore[union-attr]
    m.forward([])  # its client was told by that error
    assert commands.sent[-1][:3] == ("call", "job", "forward")


def test_loading_a_checkpoint_after_a_roll_back_needs_no_telling(tmp_path: Path) -> None:
    commands = Commands()
    m = model(commands)
    m.restore(commands.run, FAILURE)
    m.read_checkpoint(checkpoint(tmp_path, "job", "c"), True, 3, 2)
    assert (m.step, m.last_version) == (3, 2)
    m.forward([])
    assert commands.sent[-1][:3] == ("call", "job", "forward")


def test_an_unreadable_checkpoint_fails_one_re_forming_then_the_model_is_at_its_base(
    tmp_path: Path,
) -> None:
    commands = Commands()
    m = model(commands)
    m.step = 3
    m.wrote_checkpoint(checkpoint(tmp_path, "job", "torn"), optimizer=True)

    def unreadable(command: tuple[Any, ...]) -> None:
        raise RankFailed(
            "Trainer rank 0 of 2 failed during read_checkpoint (corrupt shard)",
            {"rank": 0, "operation": "read_checkpoint"},
        )

    with pytest.raises(RankFailed, match="corrupt shard"):
        m.restore(unreadable, FAILURE)  # this re-forming fails: the group is stopped

    m.restore(commands.run, FAILURE)  # the next one does not try that checkpoint again
    assert commands.sent == []
    assert m.step == 0
    assert m.restored is not None and m.restored.checkpoint is None
    assert m.restored.unreadable_checkpoint is not None
    assert "'torn'" in m.restored.unreadable_checkpoint
    assert "corrupt shard" in m.restored.unreadable_checkpoint
    with pytest.raises(RankFailed, match=r"base weights \(step 0\) since its checkpoint 'torn'"):
        m.forward([])

    m.restore(commands.run, FAILURE)  # a later failure: nothing unreadable to report any more
    assert m.restored.unreadable_checkpoint is None

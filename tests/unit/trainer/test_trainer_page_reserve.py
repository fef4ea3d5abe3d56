"""The page reserve and the in-place safetensors writer: files come out byte for byte as
safetensors writes them, written over the reserve's cached file (same inode), and a reserve
that is missing, too small or used up changes nothing but speed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.trainer.page_reserve import PageReserve, remove_leftovers
from services.trainer.safetensors_inplace import write_file
from services.trainer.weights_files import write_full

METADATA = {"format": "pt"}


def some_tensors() -> dict[str, torch.Tensor]:
    return {
        "w": torch.randn(3, 5),
        "ids": torch.arange(7),
        "half": torch.randn(4).bfloat16(),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True]),
        "view": torch.randn(6, 4)[:, 1],  # not contiguous: written from a copy
    }


def test_written_bytes_equal_safetensors_own(tmp_path: Path) -> None:
    tensors = some_tensors()
    save_file(
        {k: t.contiguous() for k, t in tensors.items()}, tmp_path / "theirs", metadata=METADATA
    )
    write_file(tensors, tmp_path / "ours", metadata=METADATA)
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()
    loaded = load_file(tmp_path / "ours")
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())


@pytest.mark.parametrize("old_size", [10, 1 << 16])
def test_an_existing_file_is_written_over_in_place_and_cut_to_size(
    tmp_path: Path, old_size: int
) -> None:
    target = tmp_path / "weights.safetensors"
    target.write_bytes(b"\xff" * old_size)
    inode = target.stat().st_ino
    tensors = some_tensors()
    write_file(tensors, target, metadata=METADATA)
    write_file(tensors, tmp_path / "fresh", metadata=METADATA)
    assert target.stat().st_ino == inode
    assert target.read_bytes() == (tmp_path / "fresh").read_bytes()


def test_unsupported_dtypes_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="complex"):
        write_file({"z": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "x")


def test_a_save_writes_over_the_reserved_file_of_its_name(tmp_path: Path) -> None:
    reserve = PageReserve(max_bytes=1 << 20)
    reserve.refill(tmp_path, {"model.safetensors": 4096, "other.safetensors": 512})
    reserve.claim(tmp_path / "model.safetensors")  # waits for the filling to finish
    (reserved,) = tmp_path.glob("page-reserve-*")
    assert sorted(p.name for p in reserved.iterdir()) == ["other.safetensors"]
    assert os.path.getsize(reserved / "other.safetensors") == 512
    moved = tmp_path / "model.safetensors"
    assert moved.stat().st_size == 4096 and moved.read_bytes() == bytes(4096)
    inode = moved.stat().st_ino
    write_file(some_tensors(), moved, metadata=METADATA)
    assert moved.stat().st_ino == inode
    reserve.release()
    assert not list(tmp_path.glob("page-reserve-*"))


def test_the_reserve_keeps_to_its_budget_and_claims_nothing_it_lacks(tmp_path: Path) -> None:
    reserve = PageReserve(max_bytes=1000)
    reserve.refill(tmp_path, {"big": 4000, "a": 600, "b": 600, "empty": 0})
    reserve.claim(tmp_path / "nothing-of-this-name")
    (reserved,) = tmp_path.glob("page-reserve-*")
    assert [p.name for p in reserved.iterdir()] == ["a"]
    assert not (tmp_path / "nothing-of-this-name").exists()
    PageReserve(max_bytes=0).refill(tmp_path / "unused", {"a": 10})
    assert not (tmp_path / "unused").exists()


def test_full_weights_written_over_a_reserve_load_back_exactly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two saves of one model, the second over the reserve filled after the first (here with
    too large files, as after a save of more weights): identical bytes either way."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    plain, reused = tmp_path / "plain", tmp_path / "staging" / "reused"
    plain.mkdir()
    reused.mkdir(parents=True)
    write_full(model, plain, shard_bytes=1 << 16)
    sizes = {p.name: p.stat().st_size + 4096 for p in plain.glob("*.safetensors")}
    assert len(sizes) > 1
    reserve = PageReserve(max_bytes=1 << 30)
    reserve.refill(reused.parent, sizes)
    write_full(model, reused, shard_bytes=1 << 16, reserve=reserve)
    reserve.release()
    assert sorted(p.name for p in reused.iterdir()) == sorted(p.name for p in plain.iterdir())
    for path in plain.glob("*.safetensors"):
        assert (reused / path.name).read_bytes() == path.read_bytes()
    assert not list(reused.parent.glob("page-reserve-*"))


def test_leftovers_of_a_killed_trainer_are_removed(tmp_path: Path) -> None:
    abandoned = PageReserve(max_bytes=1 << 20)
    abandoned.refill(tmp_path, {"a": 100})
    abandoned.claim(tmp_path / "b")  # waits for the filling; never released
    assert list(tmp_path.glob("page-reserve-*"))
    (tmp_path / "job-scratch").mkdir()
    remove_leftovers(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["job-scratch"]

"""Which cores a replica's engine threads are bound to: core lists, slots of a host's cores,
the split among an engine's ranks, slots held by lock files while a process lives, and which
setting wins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.rollout import cpu_cores
from services.rollout.cpu_cores import (
    BIND_ENV,
    bind_engine_threads,
    claim_slot,
    format_cores,
    parse_cores,
    rank_binding,
    slot_cores,
)


@pytest.mark.parametrize(
    ("text", "cores"), [("0", [0]), ("0-3,6", [0, 1, 2, 3, 6]), ("4,1-2", [1, 2, 4]), ("3-3", [3])]
)
def test_core_lists_parse_and_format(text: str, cores: list[int]) -> None:
    assert parse_cores(text) == cores
    assert parse_cores(format_cores(cores)) == cores
    assert format_cores([0, 1, 2, 3, 6]) == "0-3,6"


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "0,,1", "3-1", "0 1"])
def test_a_bad_core_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="core"):
        parse_cores(text)


def test_slots_are_runs_of_the_allowed_cores_round_robin() -> None:
    assert [slot_cores([0, 1], 1, slot) for slot in range(3)] == [[0], [1], [0]]
    assert slot_cores(range(8), 2, 3) == [6, 7]
    assert slot_cores([2, 3, 6, 7], 2, 1) == [6, 7]  # a container allowed these four
    assert slot_cores(range(5), 2, 2) == [0, 1]  # the odd core is left out
    assert slot_cores([0, 1], 4, 1) == [0, 1]  # fewer cores than a slot: all of them


def test_an_engines_ranks_split_its_cores() -> None:
    assert rank_binding([4, 5], 1) == "4-5"
    assert rank_binding([0, 1, 2, 3], 2) == "0-1|2-3"
    with pytest.raises(ValueError, match="2 ranks"):
        rank_binding([0], 2)


def test_a_slot_is_held_until_its_holder_lets_go(tmp_path: Path) -> None:
    first = claim_slot(tmp_path, [0, 1], 1)
    second = claim_slot(tmp_path, [0, 1], 1)
    assert (first.index, first.cores, second.index, second.cores) == (0, [0], 1, [1])
    third = claim_slot(tmp_path, [0, 1], 1)  # more replicas than slots: they share
    assert (third.index, third.cores) == (2, [0])
    first.lock.close()
    assert claim_slot(tmp_path, [0, 1], 1).index == 0


def test_a_killed_replica_gives_its_slot_back(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from services.rollout.cpu_cores import claim_slot; "
            f"slot = claim_slot(Path({str(tmp_path)!r}), [0, 1], 1); "
            "print(slot.index, flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        assert claim_slot(tmp_path, [0, 1], 1).index == 1  # held by the other process
    finally:
        holder.kill()
        holder.wait()
    assert claim_slot(tmp_path, [0, 1], 1).index == 0  # no goodbye needed


def test_what_binds_the_engine_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_cores.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    options = {"explicit": None, "per_replica": 2, "ranks": 1, "slots_dir": tmp_path}

    given = {BIND_ENV: "7"}  # the variable itself wins over any setting
    assert bind_engine_threads(**options, environ=given) is None and given == {BIND_ENV: "7"}

    first: dict[str, str] = {}
    second: dict[str, str] = {}
    held = [
        bind_engine_threads(**options, environ=first),
        bind_engine_threads(**options, environ=second),
    ]
    assert (first, second) == ({BIND_ENV: "0-1"}, {BIND_ENV: "2-3"})  # side by side
    assert [slot.index for slot in held if slot is not None] == [0, 1]

    explicit: dict[str, str] = {}
    assert (
        bind_engine_threads(**{**options, "explicit": "4-7", "ranks": 2}, environ=explicit) is None
    )
    assert explicit == {BIND_ENV: "4-5|6-7"}

    untouched: dict[str, str] = {}
    assert bind_engine_threads(**{**options, "per_replica": 0}, environ=untouched) is None
    assert untouched == {}  # vLLM's own binding

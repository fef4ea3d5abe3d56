"""The hand-off of full weights in `Versions`: a pending publish loaded early, later versions
swapped in under partial rollouts, and generations that moved coming back in parts per
version; against small doubles of the engine and of modelstate."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, WeightVersionSpan

from modelstate.schemas import PendingVersion, Version, VersionKind
from services.common.errors import LoomError
from services.rollout.sampling import Sampler
from services.rollout.schemas import Sample, SampleRequest
from services.rollout.versions import Versions
from tests.support.rollout_versions import (
    FakeStore,
    RecordingEngine,
    follow_until,
    live_stream,
    make_versions,
    materialize,
)

# --- full weights loaded while the publish is pending ----------------------------------------


def pending_publish(
    tmp_path: Path, store: FakeStore, job_id: str = "full-job"
) -> tuple[PendingVersion, Version]:
    """Files in a pending directory and the version that commits them, whose directory holds
    hard links to the same files (as modelstate makes it)."""
    pending_dir, version_dir = tmp_path / "pending", tmp_path / "versions" / job_id / "1"
    for directory in (pending_dir, version_dir):
        directory.mkdir(parents=True)
    for name, data in {"model.safetensors": b"w" * 64, "config.json": b"{}"}.items():
        (pending_dir / name).write_bytes(data)
        os.link(pending_dir / name, version_dir / name)
    version = store.publish(job_id, VersionKind.full)
    version = version.model_copy(update={"local_path": str(version_dir)})
    store.versions[job_id][-1] = version
    pending = PendingVersion(
        job_id=job_id,
        kind=VersionKind.full,
        staged="s1",
        local_path=str(pending_dir),
        files={"model.safetensors": 64, "config.json": 2},
    )
    return pending, version


def preloadable(tmp_path: Path) -> tuple[Versions, RecordingEngine, PendingVersion, Version]:
    """Versions reading the store's directories in place, and a pending full-weight publish."""

    async def in_place(version: Version) -> Path:
        assert version.local_path is not None
        return Path(version.local_path)

    store, engine = FakeStore(), RecordingEngine()
    pending, version = pending_publish(tmp_path, store)
    versions = Versions(
        engine, store, in_place, base_model="loom/tiny", base_path="/base", max_loras=2
    )
    return versions, engine, pending, version


async def test_a_pending_publish_is_loaded_early_and_its_version_only_named(tmp_path: Path) -> None:
    versions, engine, pending, version = preloadable(tmp_path)
    assert await versions.preload_pending(pending)
    assert engine.calls == [("reload", "pending:s1")]
    assert versions.resident().full is None  # nothing published is loaded yet
    async with versions.use("full-job", 1) as served:
        assert served.target.number == 1
    assert engine.calls == [("reload", "pending:s1"), ("label", "full-job@1")]
    resident = versions.resident().full
    assert resident is not None and resident.number == version.number


@pytest.mark.parametrize(
    ("replaced", "reloads"), [("config.json", False), ("model.safetensors", True)]
)
async def test_a_version_whose_weight_files_are_not_the_loaded_ones_is_reloaded(
    tmp_path: Path, replaced: str, reloads: bool
) -> None:
    """The store kept an identical blob it already had (another inode): of a config file (as
    for every version's) that changes nothing; of a weight file, load what the version has."""
    versions, engine, pending, version = preloadable(tmp_path)
    assert version.local_path is not None
    file = Path(version.local_path) / replaced
    data = file.read_bytes()
    file.unlink()
    file.write_bytes(data)
    assert await versions.preload_pending(pending)
    await versions.load("full-job", 1)
    assert engine.calls[-1] == (("reload", "full-job@1") if reloads else ("label", "full-job@1"))


async def test_a_busy_engine_or_files_elsewhere_are_not_loaded_early(tmp_path: Path) -> None:
    versions, engine, pending, _ = preloadable(tmp_path)
    async with versions.use(None, 0):  # a sample in flight on the base weights
        assert not await versions.preload_pending(pending)
    elsewhere = pending.model_copy(update={"local_path": str(tmp_path / "not-here")})
    truncated = pending.model_copy(update={"files": {"model.safetensors": 65}})
    adapter = pending.model_copy(update={"kind": VersionKind.lora})
    no_weights = pending.model_copy(update={"files": {"config.json": 2}})
    for hint in (elsewhere, truncated, adapter, no_weights):
        assert not await versions.preload_pending(hint)
    assert engine.calls == []
    await versions.load("full-job", 1)
    assert engine.calls == [("reload", "full-job@1")]


async def test_weights_of_a_publish_that_failed_are_swapped_out_on_demand(tmp_path: Path) -> None:
    versions, engine, pending, _ = preloadable(tmp_path)
    assert await versions.preload_pending(pending)
    async with versions.use(None, 0) as served:
        assert served.target.kind == "base"
    assert engine.calls == [("reload", "pending:s1"), ("reload", "base")]


async def test_the_follower_loads_pending_publishes_before_their_versions(tmp_path: Path) -> None:
    versions, engine, pending, version = preloadable(tmp_path)

    versions.store.subscribe_events = live_stream(  # type: ignore[method-assign]
        [pending, version]
    )
    await follow_until(versions, engine, ("label", "full-job@1"))
    assert engine.calls == [("reload", "pending:s1"), ("label", "full-job@1")]


async def hold_while_asked(
    versions: Versions, first: tuple[int, bool], then: tuple[int, bool]
) -> list[str]:
    """Hold version `first` of full-job ((number, movable)) for 50 ms while `then` is asked
    for (0: the base); the order in which each got its weights and finished."""
    events: list[str] = []
    holding = asyncio.Event()

    async def holder() -> None:
        async with versions.use("full-job", first[0], movable=first[1]):
            holding.set()
            await asyncio.sleep(0.05)
            events.append("first done")

    async def asker() -> None:
        await holding.wait()
        number, movable = then
        async with versions.use("full-job" if number else None, number, movable=movable):
            events.append(f"{number} in")

    await asyncio.gather(holder(), asker())
    return events


async def test_later_versions_swap_in_under_movable_holders_and_others_wait() -> None:
    """Partial rollouts hold full weights movable: a later version of their job swaps in
    without waiting for them; unrelated weights (the base) and pinned holders still wait."""
    versions, engine, store = make_versions()
    for _ in range(2):
        store.publish("full-job", VersionKind.full)
    assert await hold_while_asked(versions, (1, True), (2, False)) == ["2 in", "first done"]
    # 2 is loaded: a mover of 1 joins it, and the base waits for the mover
    assert await hold_while_asked(versions, (1, True), (0, False)) == ["first done", "0 in"]
    assert await hold_while_asked(versions, (1, False), (2, True)) == ["first done", "2 in"]
    assert engine.calls == [
        ("reload", "full-job@1"),
        ("reload", "full-job@2"),
        ("reload", "base"),
        ("reload", "full-job@1"),
        ("reload", "full-job@2"),
    ]


class GeneratingEngine(RecordingEngine):
    """Generates `tokens`, labelled by `spans` ((label, start, end), as vLLM reports)."""

    def __init__(self, tokens: list[int], spans: list[tuple[str, int, int]]) -> None:
        super().__init__()
        self.tokens, self.spans = tokens, spans

    async def generate(
        self,
        prompt: list[int],
        params: object,
        lora_request: object,
        interrupt: object = None,
        movable: bool = False,
    ) -> object:
        self.movable = movable
        logprobs = [{t: Logprob(logprob=-0.5)} for t in self.tokens]
        completion = CompletionOutput(
            index=0,
            text="text",
            token_ids=self.tokens,
            cumulative_logprob=None,
            logprobs=logprobs,
            finish_reason="stop",
            weight_versions=[WeightVersionSpan(*span) for span in self.spans],
        )
        return SimpleNamespace(outputs=[completion])


async def partial_sample(spans: list[tuple[str, int, int]]) -> list[Sample]:
    engine = GeneratingEngine([5, 6, 7, 8, 9], spans)
    versions = Versions(
        engine, FakeStore(), materialize, base_model="loom/tiny", base_path="/base", max_loras=2
    )
    for _ in range(2):
        await versions.target_of(versions.store.publish("full", VersionKind.full))
    await versions.target_of(versions.store.publish("other", VersionKind.full))
    sampler = Sampler(engine, versions)  # type: ignore[arg-type]
    sampler.check_prompt = lambda ids, max_tokens: None  # type: ignore[method-assign]
    parts, newer = await sampler.sample_until_newer(
        SampleRequest(job_id="full", version=1, prompt_token_ids=[1, 2])
    )
    assert newer is None  # full weights: never interrupted
    assert engine.movable  # the engine may move it (and keeps its cache blocks apart)
    return parts


async def test_a_generation_moved_to_later_weights_comes_back_in_parts_per_version() -> None:
    parts = await partial_sample([("full@1", 0, 3), ("full@2", 3, 5)])
    assert [(p.version, p.token_ids, p.logprobs, p.stop_reason, p.text) for p in parts] == [
        (1, [5, 6, 7], [-0.5] * 3, "abort", "567"),
        (2, [8, 9], [-0.5] * 2, "stop", "8"),
    ]  # as in vLLM's text: none for the stop token
    (whole,) = await partial_sample([("full@1", 0, 5)])
    assert (whole.version, whole.token_ids, whole.text) == (1, [5, 6, 7, 8, 9], "text")


@pytest.mark.parametrize("label", ["other@1", "base", "full@0", "unknown"])
async def test_tokens_from_weights_a_generation_may_not_move_to_fail_the_sample(label: str) -> None:
    with pytest.raises(LoomError, match="Sample produced by weights"):
        await partial_sample([("full@1", 0, 3), (label, 3, 5)])

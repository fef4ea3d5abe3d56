"""Version-ref resolution, the full-weights gate and LoRA residency, against small doubles of
the engine and of modelstate (no vLLM engine, no server)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, WeightVersionSpan

from modelstate.schemas import PendingVersion, PinList, Version, VersionKey, VersionKind
from services.common.errors import Conflict, InvalidInput, LoomError, NotFound, Unavailable
from services.rollout.pins import PinKeeper, holder_name
from services.rollout.sampling import Sampler
from services.rollout.schemas import Sample, SampleRequest
from services.rollout.versions import Target, Versions


class RecordingEngine:
    """Records the weight operations vLLM would perform."""

    # Python-only (no Rust backend): vLLM detokenizes; spans decode with `decode`.
    tokenizer = SimpleNamespace(decode=lambda token_ids, skip_special_tokens: "".join(
        map(str, token_ids)))

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.reload_delay = 0.0

    async def reload_weights(self, weights_path: str, label: str) -> None:
        self.calls.append(("reload", label))
        await asyncio.sleep(self.reload_delay)

    async def label_weights(self, label: str) -> None:
        self.calls.append(("label", label))

    async def add_lora(self, lora_request: object) -> None:
        self.calls.append(("add", lora_request.lora_name))  # type: ignore[attr-defined]

    async def remove_lora(self, lora_int_id: int) -> None:
        self.calls.append(("remove", lora_int_id))


class FakeStore:
    """Versions per job; `latest` is the highest number; unknown refs are NotFound."""

    def __init__(self) -> None:
        self.versions: dict[str, list[Version]] = {}
        self.lookups = 0
        self.down = False

    def publish(self, job_id: str, kind: VersionKind) -> Version:
        jobs = self.versions.setdefault(job_id, [])
        version = Version(
            id=sum(map(len, self.versions.values())) + 1, job_id=job_id, number=len(jobs) + 1,
            parent=None, step=None, kind=kind, base_model="loom/tiny", files=[], metrics={},
            aliases=["latest"], created_at=datetime.now(UTC), local_path=f"/v/{job_id}",
        )
        jobs.append(version)
        return version

    async def get_version(self, job_id: str, ref: int | str) -> Version:
        self.lookups += 1
        if self.down:
            raise Unavailable("modelstate is unreachable")
        jobs = self.versions.get(job_id, [])
        if ref == "latest" and jobs:
            return jobs[-1]
        if isinstance(ref, int) and 1 <= ref <= len(jobs):
            return jobs[ref - 1]
        raise NotFound(f"no version {ref!r} of {job_id!r}")

    async def subscribe_events(
        self, job_id: str | None = None, after: int = 0
    ) -> AsyncIterator[Version | PendingVersion]:
        raise Unavailable("modelstate is unreachable")
        yield  # pragma: no cover -- makes this an async generator


def live_stream(events: Sequence[Version | PendingVersion]
                ) -> Callable[..., AsyncIterator[Version | PendingVersion]]:
    """A `subscribe_events` that yields `events`, then stays silent, as a live stream."""
    async def subscribe_events(job_id: str | None = None, after: int = 0
                               ) -> AsyncIterator[Version | PendingVersion]:
        for event in events:
            yield event
        await asyncio.Event().wait()
    return subscribe_events


async def follow_until(versions: Versions, engine: RecordingEngine,
                       call: tuple[str, object]) -> None:
    """Run the publication follower until the engine has been asked for `call`."""
    task = asyncio.create_task(versions.follow_publications())
    for _ in range(100):
        if call in engine.calls:
            break
        await asyncio.sleep(0.01)
    task.cancel()


async def materialize(version: Version) -> Path:
    return Path(f"/v/{version.job_id}/{version.number}")


def make_versions(max_loras: int = 2) -> tuple[Versions, RecordingEngine, FakeStore]:
    engine, store = RecordingEngine(), FakeStore()
    versions = Versions(engine, store, materialize, base_model="loom/tiny", base_path="/base",
                        max_loras=max_loras)
    return versions, engine, store


async def test_base_model_without_job_and_version_zero() -> None:
    versions, _, store = make_versions()
    assert await versions.resolve(None, "latest") == Target(None, 0, "base")
    assert await versions.resolve(None, 0) == Target(None, 0, "base")
    assert await versions.resolve("job", 0) == Target("job", 0, "base")
    assert store.lookups == 0
    with pytest.raises(InvalidInput, match="needs a job_id"):
        await versions.resolve(None, 3)
    with pytest.raises(InvalidInput, match=">= 0"):
        await versions.resolve("job", -1)


async def test_latest_of_a_job_without_versions_is_the_base() -> None:
    versions, _, _ = make_versions()
    assert await versions.resolve("fresh", "latest") == Target("fresh", 0, "base")
    with pytest.raises(NotFound):
        await versions.resolve("fresh", 1)
    with pytest.raises(NotFound):
        await versions.resolve("fresh", "best")


async def test_numbers_are_cached_and_aliases_asked_every_time() -> None:
    versions, _, store = make_versions()
    store.publish("job", VersionKind.lora)
    first = await versions.resolve("job", 1)
    assert first == Target("job", 1, "lora", "/v/job/1")
    assert await versions.resolve("job", "1") == first  # digits in a string are a number
    lookups = store.lookups
    assert await versions.resolve("job", 1) == first
    assert store.lookups == lookups
    assert (await versions.resolve("job", "latest")).number == 1
    store.publish("job", VersionKind.lora)
    assert (await versions.resolve("job", "latest")).number == 2  # moved right after publish
    store.down = True
    assert await versions.resolve("job", 1) == first  # immutable: no store needed
    with pytest.raises(Unavailable):
        await versions.resolve("job", "latest")


async def test_lora_versions_stay_resident_up_to_capacity_least_recent_evicted() -> None:
    versions, engine, store = make_versions(max_loras=2)
    for _ in range(3):
        store.publish("job", VersionKind.lora)
    for number in (1, 2, 1, 3):  # 2 is now least recently used
        async with versions.use("job", number) as served:
            assert served.lora_request is not None
            assert served.lora_request.lora_name == f"job@{number}"
    assert [c for c in engine.calls if c[0] == "add"] == [("add", "job@1"), ("add", "job@2"),
                                                          ("add", "job@3")]
    assert ("remove", 2) in engine.calls  # job@2 had lora_int_id 2
    assert [(v.job_id, v.number) for v in versions.resident().loras] == [("job", 1), ("job", 3)]
    assert not any(c[0] == "reload" for c in engine.calls)  # adapters need no weight swap


async def test_lora_in_use_is_never_evicted() -> None:
    versions, engine, store = make_versions(max_loras=1)
    store.publish("job", VersionKind.lora)
    store.publish("job", VersionKind.lora)
    async with versions.use("job", 1), versions.use("job", 2):
        assert not any(c[0] == "remove" for c in engine.calls)
    assert len(versions.loras.resident) == 2  # over capacity while both were used


async def test_an_engine_without_lora_refuses_adapters_and_serves_full_weights() -> None:
    versions, engine, store = make_versions(max_loras=0)
    adapter = store.publish("job", VersionKind.lora)
    store.publish("other", VersionKind.full)
    with pytest.raises(Conflict, match="LOOM_ROLLOUT_MAX_LORAS=0") as refused:
        async with versions.use("job", 1):
            pass
    assert refused.value.detail == {"job_id": "job", "number": 1}
    await versions.preload(adapter)  # a publish of an adapter loads nothing
    assert engine.calls == []  # not even the base weights the adapter was trained on
    async with versions.use("other", 1) as served:
        assert served.lora_request is None
    assert engine.calls == [("reload", "other@1")]


async def test_full_swap_waits_for_in_flight_samples_and_reports_resident() -> None:
    versions, engine, store = make_versions()
    store.publish("full-job", VersionKind.full)
    order: list[str] = []
    base_started = asyncio.Event()

    async def base_sample() -> None:
        async with versions.use(None, 0) as served:
            assert served.target.kind == "base"
            base_started.set()
            await asyncio.sleep(0.05)
            order.append("base done")

    async def full_sample() -> None:
        await base_started.wait()
        async with versions.use("full-job", "latest") as served:
            order.append(f"full {served.target.number}")

    await asyncio.gather(base_sample(), full_sample())
    assert order == ["base done", "full 1"]
    assert engine.calls == [("reload", "full-job@1")]
    resident = versions.resident()
    assert resident.full is not None and (resident.full.job_id, resident.full.number) == (
        "full-job", 1)
    async with versions.use(None, 0):  # back to the base weights
        pass
    assert engine.calls[-1] == ("reload", "base")


async def test_swap_blocks_newcomers_on_the_old_weights() -> None:
    """A waiting swap is not starved by a stream of new samples on the loaded weights."""
    versions, engine, store = make_versions()
    store.publish("full-job", VersionKind.full)
    events: list[str] = []
    first_in = asyncio.Event()

    async def base(name: str, hold_s: float) -> None:
        async with versions.use(None, 0):
            events.append(f"{name} in")
            first_in.set()
            await asyncio.sleep(hold_s)

    async def full() -> None:
        await first_in.wait()
        async with versions.use("full-job", 1):
            events.append("full in")

    async def late_base() -> None:
        await first_in.wait()
        await asyncio.sleep(0.01)  # arrives after the swap was requested
        await base("late", 0)

    await asyncio.gather(base("early", 0.05), full(), late_base())
    assert events == ["early in", "full in", "late in"]
    assert [c[1] for c in engine.calls] == ["full-job@1", "base"]


async def test_full_swap_drops_resident_adapters() -> None:
    versions, _, store = make_versions()
    store.publish("lora-job", VersionKind.lora)
    store.publish("full-job", VersionKind.full)
    async with versions.use("lora-job", 1):
        pass
    assert versions.loras.resident == ["lora-job@1"]
    async with versions.use("full-job", 1):
        assert versions.loras.resident == []  # vLLM removes adapters on a weight reload
    async with versions.use("lora-job", 1) as served:  # needs the base back, re-adds it
        assert served.lora_request is not None and served.lora_request.lora_int_id == 2


async def test_failed_swap_leaves_weights_unknown_then_recovers() -> None:
    versions, engine, store = make_versions()
    store.publish("full-job", VersionKind.full)

    async def broken(weights_path: str, label: str) -> None:
        raise RuntimeError("corrupt shard")

    engine.reload_weights = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        async with versions.use("full-job", 1):
            pass
    assert versions.resident().full is None
    del engine.reload_weights
    async with versions.use(None, 0) as served:  # reloads the base rather than trusting it
        assert served.target.kind == "base"
    assert engine.calls == [("reload", "base")]


async def test_follower_survives_a_store_that_is_down() -> None:
    versions, _, _ = make_versions()
    task = asyncio.create_task(versions.follow_publications(retry_s=0.01))
    await asyncio.sleep(0.05)
    assert not task.done()
    task.cancel()


async def test_follower_preloads_versions_as_they_are_published() -> None:
    versions, engine, store = make_versions()
    published = [store.publish("job", VersionKind.lora), store.publish("full", VersionKind.full)]

    store.subscribe_events = live_stream(published)  # type: ignore[method-assign]
    await follow_until(versions, engine, ("reload", "full@1"))
    assert engine.calls == [("add", "job@1"), ("reload", "full@1")]


async def test_partial_rollouts_hear_of_an_adapter_once_resident_and_of_weights_at_once(
) -> None:
    """A LoRA version is announced after it is loaded (interrupted generations go on at once);
    full weights before the swap (which waits for the generations on the old ones to stop)."""
    versions, engine, store = make_versions()
    published = [store.publish("job", VersionKind.lora), store.publish("full", VersionKind.full)]
    loaded: list[str] = []
    heard: dict[str, list[str]] = {}

    async def slow(operation: str, name: str) -> None:
        engine.calls.append((operation, name))
        await asyncio.sleep(0.05)
        loaded.append(name)

    engine.add_lora = lambda request: slow("add", request.lora_name)  # type: ignore[method-assign]
    engine.reload_weights = lambda path, label: slow("reload", label)  # type: ignore[method-assign]

    async def listen(job_id: str) -> None:
        await versions.newer_than(job_id, 0)
        heard[job_id] = list(loaded)

    store.subscribe_events = live_stream(published)  # type: ignore[method-assign]
    listeners = [asyncio.create_task(listen(job)) for job in ("job", "full")]
    follower = asyncio.create_task(versions.follow_publications())
    await asyncio.wait_for(asyncio.gather(*listeners), timeout=5)
    follower.cancel()
    assert heard == {"job": ["job@1"], "full": ["job@1"]}  # full@1 not loaded yet


async def test_a_partial_sample_on_an_outdated_version_moves_on_without_loading_it() -> None:
    """Another episode of the group started on version 1 after version 2 was announced: it
    goes straight to 2 (holding 1 could swap old full weights back in)."""
    versions, engine, store = make_versions()
    for _ in range(2):
        await versions._announce(store.publish("full", VersionKind.full))
    sampler = Sampler(engine, versions)  # type: ignore[arg-type]
    sampler.check_prompt = lambda ids, max_tokens: None  # type: ignore[method-assign]
    (sample,), newer = await sampler.sample_until_newer(SampleRequest(
        job_id="full", version=1, prompt_token_ids=[1, 2]))
    assert (sample.token_ids, sample.stop_reason, newer) == ([], "abort", 2)
    assert engine.calls == []  # no swap, no generation


class PinRecorder:
    def __init__(self, failures: int = 0) -> None:
        self.calls: list[tuple[str, list[tuple[str, int]], float]] = []
        self.failures = failures

    async def set_pins(self, holder: str, versions: list[VersionKey], ttl_s: float) -> PinList:
        if self.failures:
            self.failures -= 1
            raise Unavailable("modelstate is unreachable")
        self.calls.append((holder, [(v.job_id, v.number) for v in versions], ttl_s))
        return PinList(pins=[])


async def test_resident_versions_are_pinned_renewed_and_released() -> None:
    versions, _, store = make_versions(max_loras=2)
    store.publish("job", VersionKind.lora)
    store.publish("job", VersionKind.full)
    recorder = PinRecorder(failures=1)  # modelstate down at first: retried at the next poll
    keeper = PinKeeper(recorder, holder_name("http://127.0.0.1:8001"), versions.pinned_keys,
                       ttl_s=0.3, poll_s=0.01)
    task = asyncio.create_task(keeper.run())
    await asyncio.sleep(0.05)
    await versions.load("job", 1)  # an adapter becomes resident
    await asyncio.sleep(0.05)
    await versions.load("job", 2)  # full weights swap in; adapters are dropped
    await asyncio.sleep(0.25)  # past ttl/3: the lease is renewed unchanged
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    sets = [pins for _, pins, _ in recorder.calls]
    assert recorder.calls[0][0] == "rollout@127.0.0.1:8001"
    assert sets[0] == [] and [("job", 1)] in sets
    assert sets.index([("job", 2)]) > sets.index([("job", 1)])
    assert sets.count([("job", 2)]) >= 2  # renewed
    assert sets[-1] == []  # released on shutdown


# --- full weights loaded while the publish is pending ----------------------------------------

def pending_publish(tmp_path: Path, store: FakeStore, job_id: str = "full-job"
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
    pending = PendingVersion(job_id=job_id, kind=VersionKind.full, staged="s1",
                             local_path=str(pending_dir),
                             files={"model.safetensors": 64, "config.json": 2})
    return pending, version


def preloadable(tmp_path: Path
                ) -> tuple[Versions, RecordingEngine, PendingVersion, Version]:
    """Versions reading the store's directories in place, and a pending full-weight publish."""
    async def in_place(version: Version) -> Path:
        assert version.local_path is not None
        return Path(version.local_path)

    store, engine = FakeStore(), RecordingEngine()
    pending, version = pending_publish(tmp_path, store)
    versions = Versions(engine, store, in_place, base_model="loom/tiny", base_path="/base",
                        max_loras=2)
    return versions, engine, pending, version


async def test_a_pending_publish_is_loaded_early_and_its_version_only_named(
    tmp_path: Path
) -> None:
    versions, engine, pending, version = preloadable(tmp_path)
    assert await versions.preload_pending(pending)
    assert engine.calls == [("reload", "pending:s1")]
    assert versions.resident().full is None  # nothing published is loaded yet
    async with versions.use("full-job", 1) as served:
        assert served.target.number == 1
    assert engine.calls == [("reload", "pending:s1"), ("label", "full-job@1")]
    resident = versions.resident().full
    assert resident is not None and resident.number == version.number


@pytest.mark.parametrize(("replaced", "reloads"), [("config.json", False),
                                                  ("model.safetensors", True)])
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


async def test_weights_of_a_publish_that_failed_are_swapped_out_on_demand(
    tmp_path: Path
) -> None:
    versions, engine, pending, _ = preloadable(tmp_path)
    assert await versions.preload_pending(pending)
    async with versions.use(None, 0) as served:
        assert served.target.kind == "base"
    assert engine.calls == [("reload", "pending:s1"), ("reload", "base")]


async def test_the_follower_loads_pending_publishes_before_their_versions(
    tmp_path: Path
) -> None:
    versions, engine, pending, version = preloadable(tmp_path)

    versions.store.subscribe_events = live_stream(  # type: ignore[method-assign]
        [pending, version])
    await follow_until(versions, engine, ("label", "full-job@1"))
    assert engine.calls == [("reload", "pending:s1"), ("label", "full-job@1")]


async def hold_while_asked(versions: Versions, first: tuple[int, bool],
                           then: tuple[int, bool]) -> list[str]:
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
    assert engine.calls == [("reload", "full-job@1"), ("reload", "full-job@2"),
                            ("reload", "base"), ("reload", "full-job@1"),
                            ("reload", "full-job@2")]


class GeneratingEngine(RecordingEngine):
    """Generates `tokens`, labelled by `spans` ((label, start, end), as vLLM reports)."""

    def __init__(self, tokens: list[int], spans: list[tuple[str, int, int]]) -> None:
        super().__init__()
        self.tokens, self.spans = tokens, spans

    async def generate(self, prompt: list[int], params: object, lora_request: object,
                       interrupt: object = None, movable: bool = False) -> object:
        self.movable = movable
        logprobs = [{t: Logprob(logprob=-0.5)} for t in self.tokens]
        completion = CompletionOutput(
            index=0, text="text", token_ids=self.tokens, cumulative_logprob=None,
            logprobs=logprobs, finish_reason="stop",
            weight_versions=[WeightVersionSpan(*span) for span in self.spans])
        return SimpleNamespace(outputs=[completion])



async def partial_sample(spans: list[tuple[str, int, int]]) -> list[Sample]:
    engine = GeneratingEngine([5, 6, 7, 8, 9], spans)
    versions = Versions(engine, FakeStore(), materialize, base_model="loom/tiny",
                        base_path="/base", max_loras=2)
    for _ in range(2):
        await versions.target_of(versions.store.publish("full", VersionKind.full))
    await versions.target_of(versions.store.publish("other", VersionKind.full))
    sampler = Sampler(engine, versions)  # type: ignore[arg-type]
    sampler.check_prompt = lambda ids, max_tokens: None  # type: ignore[method-assign]
    parts, newer = await sampler.sample_until_newer(SampleRequest(
        job_id="full", version=1, prompt_token_ids=[1, 2]))
    assert newer is None  # full weights: never interrupted
    assert engine.movable  # the engine may move it (and keeps its cache blocks apart)
    return parts


async def test_a_generation_moved_to_later_weights_comes_back_in_parts_per_version() -> None:
    parts = await partial_sample([("full@1", 0, 3), ("full@2", 3, 5)])
    assert [(p.version, p.token_ids, p.logprobs, p.stop_reason, p.text) for p in parts] == [
        (1, [5, 6, 7], [-0.5] * 3, "abort", "567"),
        (2, [8, 9], [-0.5] * 2, "stop", "8")]  # as in vLLM's text: none for the stop token
    (whole,) = await partial_sample([("full@1", 0, 5)])
    assert (whole.version, whole.token_ids, whole.text) == (1, [5, 6, 7, 8, 9], "text")


@pytest.mark.parametrize("label", ["other@1", "base", "full@0", "unknown"])
async def test_tokens_from_weights_a_generation_may_not_move_to_fail_the_sample(
        label: str) -> None:
    with pytest.raises(LoomError, match="Sample produced by weights"):
        await partial_sample([("full@1", 0, 3), (label, 3, 5)])

"""Version-ref resolution, the full-weights gate, LoRA residency, the publication follower
and pins, against small doubles of the engine and of modelstate (no vLLM engine, no server).
The hand-off of full weights (loading a pending publish, swapping under partial rollouts) is
in test_rollout_handoff.py."""

from __future__ import annotations

import asyncio

import pytest

from modelstate.schemas import PinList, VersionKey, VersionKind
from services.common.errors import Conflict, InvalidInput, NotFound, Unavailable
from services.rollout.pins import PinKeeper, holder_name
from services.rollout.sampling import Sampler
from services.rollout.schemas import SampleRequest
from services.rollout.versions import Target
from tests.support.rollout_versions import (
    follow_until,
    live_stream,
    make_versions,
)


async def test_base_model_without_job_and_version_zero() -> None:
    versions, _, store = make_versions()
    assert await versions.resolve(None, "latest") == Target(None, 0, "base")
    assert await versions.resolve(None, 0) == Target(None, 0, "base")
    assert await versions.resolve("job", 0) == Target("job", 0, "base")
    assert store.lookups == 0
    with pytest.raises(InvalidInput, match="needs a job_id"):
        await versions.resolve(None, 3)
    with pytest.raises(InvalidInput, match="go from 0 \(the base model\)"):
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
    assert [c for c in engine.calls if c[0] == "add"] == [
        ("add", "job@1"),
        ("add", "job@2"),
        ("add", "job@3"),
    ]
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
        "full-job",
        1,
    )
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


async def test_partial_rollouts_hear_of_an_adapter_once_resident_and_of_weights_at_once() -> None:
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
    (sample,), newer = await sampler.sample_until_newer(
        SampleRequest(job_id="full", version=1, prompt_token_ids=[1, 2])
    )
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
    keeper = PinKeeper(
        recorder, holder_name("http://127.0.0.1:8001"), versions.pinned_keys, ttl_s=0.3, poll_s=0.01
    )
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

"""The SDK pipeline's orchestration against a scripted job (the real services:
tests/e2e/test_agentic.py and bench/pipeline.py). Order and overlap are checked through an
event log, never through timings."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from agents.algorithms import dapo, grpo
from agents.sdk.pipeline import AsyncPipeline, FinishedGroups, group_version
from services.common.errors import InvalidInput, NotFound
from services.common.schemas import ErrorBody
from services.rollout.schemas import RolloutEvent, RolloutGroup, Trajectory, TurnInfo
from services.trainer.schemas import ForwardBackwardResult, SaveWeightsResult


def trajectory(task: dict[str, Any], i: int, version: int) -> Trajectory:
    return Trajectory(
        task_index=0,
        sample_index=i,
        prompt_token_ids=[1],
        token_ids=[2, 3],
        logprobs=[-0.1, -0.1],
        loss_mask=[1, 1],
        stop_reason="done",
        response="",
        turns=[TurnInfo(kind="model", start=0, end=2, text="", version=version)],
        reward=task["rewards"][i % len(task["rewards"])],
    )


@dataclass
class Stream:
    """The rollout service as the pipeline sees it: each group starts on the job's latest
    version (a task's `starts_on` makes it wait for that version first: a group queued for a
    slot) and, with `max_staleness`, is cancelled once the job has published more than that
    many versions after it (a 'stale' error)."""

    job: ScriptedJob
    tasks: list[dict[str, Any]]
    group_size: int
    max_staleness: int | None = None
    errors: list[Any] = field(default_factory=list)

    async def events(self) -> Any:
        """Groups (or errors) in the order they finish (a task's `delay` makes it slow)."""
        running = [asyncio.ensure_future(self._group(task)) for task in self.tasks]
        try:
            for finished in asyncio.as_completed(running):
                yield await finished
        except asyncio.CancelledError:  # the client went away: the service stops the rest
            self.job.log.append(("cancelled", [task.get("id") for task in self.tasks]))
            for group in running:
                group.cancel()
            raise

    async def _group(self, task: dict[str, Any]) -> RolloutEvent:
        await self.job.published_at_least(task.get("starts_on", 0))
        version = self.job.current
        self.job.in_flight += 1
        self.job.log.append(("sample", version, self.job.training, self.job.in_flight))
        try:
            if not await self._sampled_within_staleness(version, task.get("delay", 0.001)):
                self.job.log.append(("stale", task.get("id")))
                return RolloutEvent(
                    type="error",
                    error=ErrorBody(code="stale", message="stale", detail={"task_index": 0}),
                )
        finally:
            self.job.in_flight -= 1
        self.job.log.append(("delivered", task.get("id")))
        return RolloutEvent(
            type="group",
            group=RolloutGroup(
                task_index=0,
                task_id=task.get("id"),
                trajectories=[trajectory(task, i, version) for i in range(self.group_size)],
            ),
        )

    async def _sampled_within_staleness(self, version: int, delay: float) -> bool:
        sampling = asyncio.ensure_future(asyncio.sleep(delay))
        if self.max_staleness is None:
            await sampling
            return True
        outdated = asyncio.ensure_future(
            self.job.published_at_least(version + self.max_staleness + 1)
        )
        try:
            await asyncio.wait([sampling, outdated], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sampling.cancel()
            outdated.cancel()
        return not outdated.done() or outdated.cancelled()


@dataclass
class ScriptedJob:
    current: int = 0  # the latest published version
    training: bool = False
    in_flight: int = 0  # groups being sampled
    refuse: bool = False
    train_s: float = 0.01  # each forward_backward
    log: list[tuple[Any, ...]] = field(default_factory=list)
    trained_groups: list[int] = field(default_factory=list)
    passes: list[list[Any]] = field(default_factory=list)  # the data of each forward_backward
    rollout_options: list[dict[str, Any]] = field(default_factory=list)
    published: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def version(self, ref: str) -> Any:
        assert ref == "latest" and self.current == 0, "only asked before the first step"
        raise NotFound("no versions yet")

    async def rollouts(self, tasks: list[dict[str, Any]], **options: Any) -> Stream:
        if self.refuse:
            raise InvalidInput("Unknown environment 'chess'")
        self.rollout_options.append(options)
        return Stream(self, tasks, options["group_size"], options.get("max_staleness"))

    async def published_at_least(self, number: int) -> None:
        async with self.published:
            await self.published.wait_for(lambda: self.current >= number)

    async def forward_backward(
        self, data: list[Any], loss: Any, return_logprobs: bool = False
    ) -> Any:
        self.training = True
        self.trained_groups.append(len(data))
        self.passes.append(data)
        logprobs = [[-0.25 * i for i in range(len(d.input_ids))] for d in data]

        async def done() -> ForwardBackwardResult:
            await asyncio.sleep(self.train_s)  # lets in-flight rollouts make progress meanwhile
            return ForwardBackwardResult(
                loss=0.5,
                num_tokens=len(data),
                metrics={},
                logprobs=logprobs if return_logprobs else None,
            )

        return asyncio.ensure_future(done())

    async def optim_step(self, adam: Any) -> Any:
        self.log.append(("optim_step",))
        return asyncio.ensure_future(asyncio.sleep(0))

    async def save_weights(self, metrics: dict[str, float]) -> Any:
        async def saved() -> SaveWeightsResult:
            await asyncio.sleep(0.01)
            async with self.published:
                self.current += 1
                self.published.notify_all()
            self.training = False
            self.log.append(("published", self.current))
            return SaveWeightsResult(
                job_id="j", number=self.current, kind="full", step=self.current
            )

        return asyncio.ensure_future(saved())


def tasks(n: int, rewards: list[float] | None = None) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "prompt": "p", "rewards": rewards or [1.0, 0.0]} for i in range(n)]


async def run(job: ScriptedJob, steps: int, **options: Any) -> list[Any]:
    defaults: dict[str, Any] = {"env": "arithmetic", "groups_per_step": 2, "group_size": 2}
    pipeline = AsyncPipeline(
        job,
        options.pop("algorithm", grpo()),  # type: ignore[arg-type]
        **{**defaults, **options},
    )
    return [result async for result in pipeline.run(steps)]


async def test_sync_trains_each_step_on_the_version_just_published() -> None:
    job = ScriptedJob()
    results = await run(job, 3, tasks=tasks(20), mode="sync")
    assert [r.version for r in results] == [1, 2, 3]
    assert all(r.groups == 2 and r.max_staleness == 0 for r in results)
    # nothing is sampled while the trainer trains
    assert not any(e[0] == "sample" and e[2] for e in job.log)


async def test_async_samples_while_training_within_the_staleness_bound() -> None:
    job = ScriptedJob()
    results = await run(job, 4, tasks=tasks(40), mode="async", max_staleness=1)
    assert [r.version for r in results] == [1, 2, 3, 4]
    assert any(e[0] == "sample" and e[2] for e in job.log), "no rollout overlapped training"
    assert all(r.max_staleness <= 1 for r in results)
    assert any(r.max_staleness == 1 for r in results)


async def test_slow_groups_do_not_hold_back_the_next_steps() -> None:
    job = ScriptedJob()
    fast = tasks(40)
    slow = [{**task, "id": f"slow{i}", "delay": 0.3} for i, task in enumerate(tasks(2))]
    # A slow group among the first step's and among the second step's tasks.
    results = await run(
        job, 4, tasks=[slow[0], fast[0], slow[1], *fast[1:]], mode="async", max_staleness=1
    )
    assert [r.groups for r in results] == [2, 2, 2, 2]
    # Groups are asked for one by one, so two slow ones still sampling take two places of
    # the four the staleness budget allows (not two steps' worth): steps go on meanwhile.
    slow_done = [i for i, e in enumerate(job.log) if e[0] == "delivered" and "slow" in e[1]]
    assert job.log.index(("published", 3)) < min(slow_done, default=len(job.log))


async def test_groups_that_fell_too_far_behind_are_cancelled_and_replaced() -> None:
    """A group still sampling on version 0 when version 2 is published could only be dropped
    (staleness 1): the service cancels it then (the pipeline asks it to, with its
    max_staleness), and the steps go on with other groups."""
    job = ScriptedJob()
    slow = {**tasks(1)[0], "id": "slow", "delay": 30}
    results = await run(job, 4, tasks=[slow, *tasks(40)], mode="async", max_staleness=1)
    assert [r.groups for r in results] == [2, 2, 2, 2]
    assert {o.get("max_staleness") for o in job.rollout_options} == {1}
    assert sum(r.abandoned_stale for r in results) == 1
    assert sum(r.failed_groups for r in results) == 0
    assert ("delivered", "slow") not in job.log
    assert (
        job.log.index(("published", 2))
        < job.log.index(("stale", "slow"))
        < job.log.index(("published", 3))
    )


async def test_a_requests_groups_that_start_later_are_not_cancelled_with_its_stale_ones() -> None:
    """The first request holds a slow group, started on version 0, and a group that waits
    for a slot until version 2 is out. Version 2 makes the slow one stale; the waiting one
    starts on 2 and is trained: staleness is each group's, by the version it started on, not
    the version current when its request was made (which cancelled both)."""
    job = ScriptedJob()
    slow = {**tasks(1)[0], "id": "slow", "delay": 30}
    queued = {**tasks(1)[0], "id": "queued", "starts_on": 2}
    results = await run(job, 4, tasks=[slow, queued, *tasks(40)], mode="async", max_staleness=1)
    assert ("stale", "slow") in job.log and ("delivered", "queued") in job.log
    assert not [e for e in job.log if e[0] == "cancelled" and "queued" in e[1]]
    assert sum(r.abandoned_stale for r in results) == 1
    assert max(r.max_staleness for r in results) <= 1


async def test_a_bound_on_starts_does_not_ask_the_service_to_cancel() -> None:
    """staleness_bound="started" trains late groups; refresh 'turn' moves a group's turns on
    to newer versions (no one version to judge it by): neither asks for cancellation."""
    for options in ({"staleness_bound": "started"}, {"version_refresh": "turn"}):
        job = ScriptedJob()
        await run(job, 2, tasks=tasks(20), mode="async", **options)
        assert all("max_staleness" not in o for o in job.rollout_options)


async def test_a_bound_on_starts_trains_late_groups_instead() -> None:
    """staleness_bound="started": the same slow group is neither cancelled nor dropped; it is
    trained by the step that finds it finished, however late."""
    job = ScriptedJob()
    slow = {**tasks(1)[0], "id": "slow", "delay": 0.1}
    results = await run(
        job, 20, tasks=[slow, *tasks(80)], mode="async", max_staleness=1, staleness_bound="started"
    )
    assert ("delivered", "slow") in job.log
    assert sum(r.dropped_stale + r.abandoned_stale for r in results) == 0
    assert max(r.max_staleness for r in results) > 1  # the slow group, trained late


async def test_a_group_near_the_staleness_bound_is_trained_before_fresher_ones() -> None:
    """One group per step, max_staleness 3, a slow trainer (groups queue up). A slow group
    started on version 0 finishes behind groups of version 1 and 2 that finished earlier.
    Taken in the order they finished, it would come out at version 4 (staleness 4: dropped);
    oldest first, the step on version 3 trains it."""
    job = ScriptedJob(train_s=0.2)
    slow = {**tasks(1)[0], "id": "slow", "delay": 0.32}  # publishes come ~0.21 s apart
    results = await run(
        job, 6, tasks=[slow, *tasks(40)], mode="async", max_staleness=3, groups_per_step=1
    )
    assert ("delivered", "slow") in job.log
    assert sum(r.dropped_stale + r.abandoned_stale for r in results) == 0
    assert [r.max_staleness for r in results].index(3) == 3  # the step on version 3


async def test_finished_groups_come_out_oldest_version_first() -> None:
    def group(task_id: str, version: int) -> RolloutGroup:
        return RolloutGroup(
            task_index=0, task_id=task_id, trajectories=[trajectory({"rewards": [1.0]}, 0, version)]
        )

    queue = FinishedGroups()
    for task_id, version in [("a", 2), ("b", 1), ("c", 0), ("d", 1)]:
        queue.put(group(task_id, version))
    queue.put(None)
    out = [await queue.get() for _ in range(5)]
    assert out[0] is None  # a failed request's wake-up goes first
    assert [g.task_id for g in out[1:] if g is not None] == ["c", "b", "d", "a"]


async def test_zero_variance_groups_are_replaced_by_more_sampling() -> None:
    job = ScriptedJob()
    mixed = [t for pair in zip(tasks(20, [1.0, 1.0]), tasks(20), strict=True) for t in pair]
    results = await run(job, 3, tasks=mixed, algorithm=dapo(max_tokens=8))
    assert all(r.groups == 2 for r in results)
    assert sum(r.dropped_filtered for r in results) >= 3
    assert job.trained_groups == [4, 4, 4]  # 2 groups x 2 trajectories each step
    assert all(r.mean_reward < 1.0 for r in results)


@pytest.mark.parametrize("bound", ["trained", "started"])
async def test_sync_drops_groups_left_over_from_an_older_version(bound: str) -> None:
    job = ScriptedJob()
    results = await run(job, 3, tasks=tasks(30), mode="sync", oversample=2.0, staleness_bound=bound)
    assert sum(r.dropped_stale for r in results) >= 2
    assert all(r.max_staleness == 0 for r in results)


async def test_running_out_of_tasks_ends_the_run_early() -> None:
    results = await run(ScriptedJob(), 10, tasks=tasks(5))
    assert [r.groups for r in results] == [2, 2, 1]


async def test_a_refused_rollout_request_is_raised() -> None:
    with pytest.raises(InvalidInput, match="chess"):
        await run(ScriptedJob(refuse=True), 2, tasks=tasks(4))


def test_group_version_is_the_oldest_turn() -> None:
    group = RolloutGroup(
        task_index=0,
        trajectories=[trajectory({"rewards": [1.0]}, 0, 3), trajectory({"rewards": [1.0]}, 1, 2)],
    )
    assert group_version(group) == 2


async def test_epochs_make_several_passes_over_each_batch() -> None:
    job = ScriptedJob()
    results = await run(job, 2, tasks=tasks(20), mode="sync", epochs=3)
    assert job.trained_groups == [4] * 6  # 2 groups of 2 samples, three passes per step
    assert [e for e in job.log if e[0] not in ("sample", "delivered")] == [("optim_step",)] * 3 + [
        ("published", 1)
    ] + [("optim_step",)] * 3 + [("published", 2)]
    assert [r.loss for r in results] == [0.5, 0.5]


async def test_later_passes_clip_against_the_first_passs_policy_under_truncated_is() -> None:
    job = ScriptedJob()
    await run(job, 1, tasks=tasks(20), mode="sync", epochs=3, algorithm=grpo(tis_cap=2.0))
    first, *later = job.passes
    assert all(d.proximal_logprobs is None for d in first)
    for data in later:  # what the first pass returned, row for row
        assert [d.proximal_logprobs for d in data] == [
            [-0.25 * i for i in range(len(d.input_ids))] for d in data
        ]
        assert [d.logprobs for d in data] == [d.logprobs for d in first]  # still the sampler's
    plain = ScriptedJob()
    await run(plain, 1, tasks=tasks(20), mode="sync", epochs=3)
    assert all(d.proximal_logprobs is None for data in plain.passes for d in data)


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "later"},
        {"groups_per_step": 0},
        {"oversample": 0.5},
        {"max_staleness": -1},
        {"epochs": 0},
        {"staleness_bound": "finished"},
    ],
)
def test_bad_pipeline_options(options: dict[str, Any]) -> None:
    base: dict[str, Any] = {"env": "e", "tasks": [], "groups_per_step": 1, "group_size": 1}
    with pytest.raises(ValueError):
        AsyncPipeline(ScriptedJob(), grpo(), **{**base, **options})  # type: ignore[arg-type]

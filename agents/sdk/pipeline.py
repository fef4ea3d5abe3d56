"""The RL loop, written once: rollouts → algorithm → trainer → publish, sync or async.

    pipeline = AsyncPipeline(job, dapo(max_tokens=96), env="python_tool", tasks=tasks,
                             groups_per_step=16, group_size=8, mode="async", max_staleness=1)
    async for step in pipeline.run(steps=50):
        print(step.version, step.mean_reward)

- `sync`: the groups of step k are sampled by the version step k - 1 published; the engine
  waits while the trainer trains, and the trainer waits while the engine samples.
- `async`: rollouts for the next `max_staleness` steps run while the trainer trains, so both
  stay busy. Groups are asked for as places free up, not step by step, so a step's slowest
  group never holds back the next step's. A group sampled more than `max_staleness`
  versions before the one being trained is dropped (counted in `StepResult.dropped_stale`);
  set the algorithm's `tis_cap` to correct the staleness that remains. A group that can no
  longer be trained (the version it started on fell that far behind while it ran: long
  generations) is cancelled by the rollout service as soon as the job publishes the version
  that makes it so (the request's `max_staleness`), so the engine samples groups that can be
  (`StepResult.abandoned_stale`). Each group is judged by the version it started on, not by
  the one current when its request was made: groups still waiting for a slot start on the
  newest version and are kept. Long generations are the ones that fall behind, so
  this bound trains on fewer long samples than were drawn; `staleness_bound="started"` bounds
  only how far ahead groups start (AReaL's admission control) and trains every group that
  finishes, however late (`StepResult.max_staleness` says how late; set `tis_cap`); `sync`
  always drops.
- Finished groups wait for a step oldest version first (`FinishedGroups`): a step takes the
  groups closest to leaving the staleness bound before fresher ones that finished earlier
  (earliest deadline first). Long generations finish late and on old versions; taken in the
  order they finish, they sat behind fresher groups until they were too stale to train.
- Groups the algorithm filters out (DAPO's zero-variance groups) are replaced by sampling
  more: a step trains on `groups_per_step` groups with signal (`oversample` > 1 asks for more
  up front, so fewer top-ups are needed); extra groups carry over to the next step.
- `epochs` > 1 makes several optimizer steps on each step's batch (PPO's epochs, TRL's
  `num_iterations`); the PPO-style losses clip the ratio to the sampling policy, which is what
  keeps the later passes close to the data.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from agents.algorithms.algorithm import Algorithm
from agents.sdk._futures import OperationFuture
from agents.sdk.job import AsyncJobClient
from services.common.errors import NotFound
from services.rollout.schemas import STALE_GROUP, RolloutGroup, RolloutTask, SamplingParams
from services.trainer.schemas import AdamParams, Datum, ForwardBackwardResult


@dataclass
class StepResult:
    step: int
    version: int  # published by this step
    groups: int  # trained on
    mean_reward: float  # over every scored group this step looked at
    dropped_stale: int = 0
    abandoned_stale: int = 0  # cancelled while sampling: they would have been dropped
    dropped_filtered: int = 0  # by the algorithm (zero variance, unscored)
    failed_groups: int = 0  # the rollout service reported an error for them
    max_staleness: int = 0  # versions between a trained group's sampler and the trainer
    wait_s: float = 0.0  # the trainer waiting for groups
    train_s: float = 0.0  # forward_backward + optim_step + save_weights
    loss: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


def group_version(group: RolloutGroup) -> int:
    """The oldest version that sampled any of the group's tokens."""
    versions = [v for t in group.trajectories for v in t.versions]
    return min(versions) if versions else 0


class FinishedGroups:
    """Finished groups, the oldest version first and, within a version, in the order they
    finished. `None` (a request ended with groups missing) comes out before any group: it
    only wakes the consumer to ask for replacements."""

    def __init__(self) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, RolloutGroup | None]] = (
            asyncio.PriorityQueue()
        )
        self._arrivals = itertools.count()  # ties never compare groups

    def put(self, group: RolloutGroup | None) -> None:
        version = -1 if group is None else group_version(group)
        self._queue.put_nowait((version, next(self._arrivals), group))

    async def get(self) -> RolloutGroup | None:
        return (await self._queue.get())[2]


class AsyncPipeline:
    def __init__(
        self,
        job: AsyncJobClient,
        algorithm: Algorithm,
        *,
        env: str,
        tasks: Iterable[RolloutTask | dict[str, Any]],
        groups_per_step: int,
        group_size: int,
        params: SamplingParams | None = None,
        mode: Literal["sync", "async"] = "sync",
        max_staleness: int = 1,
        staleness_bound: Literal["trained", "started"] = "trained",
        oversample: float = 1.0,
        epochs: int = 1,
        adam: AdamParams | None = None,
        **rollout_options: Any,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode is 'sync' or 'async', not {mode!r}")
        if staleness_bound not in ("trained", "started"):
            raise ValueError(f"staleness_bound is 'trained' or 'started', not {staleness_bound!r}")
        if groups_per_step < 1 or oversample < 1 or max_staleness < 0 or epochs < 1:
            raise ValueError(
                "groups_per_step >= 1, oversample >= 1, max_staleness >= 0 and epochs >= 1"
            )
        self.job = job
        self.algorithm = algorithm
        self.env = env
        self.tasks: Iterator[RolloutTask | dict[str, Any]] = iter(tasks)
        self.groups_per_step = groups_per_step
        self.group_size = group_size
        self.params = params or SamplingParams()
        self._request_numbers = itertools.count()  # a seed of its own per request
        self.staleness = max_staleness if mode == "async" else 0
        self.drops_late = staleness_bound == "trained" or mode == "sync"  # sync: never late
        self.oversample = oversample
        self.epochs = epochs
        self.adam = adam or AdamParams()
        self.rollout_options = rollout_options
        if self.drops_late and rollout_options.get("version_refresh") != "turn":
            # The service cancels each group that could only be dropped (refresh 'turn' moves
            # a group's turns on: it has no one version to judge it by).
            self.rollout_options = {**rollout_options, "max_staleness": self.staleness}
        self._groups = FinishedGroups()
        self._requests: set[asyncio.Task[None]] = set()
        self._published = 0
        self._outstanding = 0  # groups asked for and not yet taken by a step
        self._need = 0  # groups the step being assembled still needs
        self._tasks_left = True
        self._error: BaseException | None = None
        self._failed = 0
        self._abandoned = 0

    async def run(self, steps: int) -> AsyncIterator[StepResult]:
        """Train `steps` steps (fewer if the tasks run out); one result per step."""
        try:
            self._published = await self._latest()
            for step in range(1, steps + 1):
                result = await self._step(step, self._published)
                if result is None:
                    return
                self._published = result.version
                yield result
        finally:
            for request in self._requests:
                request.cancel()
            await asyncio.gather(*self._requests, return_exceptions=True)

    async def _step(self, step: int, published: int) -> StepResult | None:
        result = StepResult(step=step, version=published, groups=0, mean_reward=0.0)
        failed_before, abandoned_before = self._failed, self._abandoned
        kept: list[Datum] = []
        rewards: list[float] = []
        began = time.perf_counter()
        while result.groups < self.groups_per_step:
            self._need = self.groups_per_step - result.groups
            group = await self._next_group()
            if group is None:  # tasks exhausted and everything sampled was used
                if not result.groups:
                    return None
                break
            staleness = published - group_version(group)
            if staleness > self.staleness and self.drops_late:
                result.dropped_stale += 1
                continue
            batch = self.algorithm.batch([group])
            rewards.extend(batch.rewards)
            if not batch.data:
                result.dropped_filtered += 1
                continue
            kept.extend(batch.data)
            result.groups += 1
            result.max_staleness = max(result.max_staleness, staleness)
        self._need = 0  # while this step trains, only the next steps' groups are sampled
        result.wait_s = time.perf_counter() - began
        result.failed_groups = self._failed - failed_before
        result.abandoned_stale = self._abandoned - abandoned_before
        began = time.perf_counter()
        passes = await self._train(kept)
        trained = passes[0]  # the loss and metrics of the data as sampled
        result.mean_reward = sum(rewards) / len(rewards) if rewards else 0.0
        saved = await self.job.save_weights(metrics={"reward": result.mean_reward})
        loss = await trained
        result.version = (await saved).number
        result.train_s = time.perf_counter() - began
        result.loss, result.metrics = loss.loss, loss.metrics
        return result

    async def _train(self, data: list[Datum]) -> list[OperationFuture[ForwardBackwardResult]]:
        """`epochs` passes over the step's batch, each followed by an optimizer step, queued
        at once (the trainer runs them in order). With truncated IS the later passes clip
        against the policy before the first update (decoupled PPO): the first pass returns its
        logprobs, which the others carry as `proximal_logprobs`."""
        loss = self.algorithm.loss
        if "temperature" not in loss.model_fields_set and self.params.temperature > 0:
            # The trainer's policy at the temperature the groups were sampled at.
            loss = loss.model_copy(update={"temperature": self.params.temperature})
        passes = []
        if self.epochs > 1 and loss.tis_cap is not None:
            first = await self.job.forward_backward(data, loss, return_logprobs=True)
            await self.job.optim_step(self.adam)
            proximal = (await first).logprobs
            assert proximal is not None
            data = [
                datum.model_copy(update={"proximal_logprobs": row})
                for datum, row in zip(data, proximal, strict=True)
            ]
            passes.append(first)
        while len(passes) < self.epochs:
            passes.append(await self.job.forward_backward(data, loss))
            await self.job.optim_step(self.adam)
        return passes

    async def _next_group(self) -> RolloutGroup | None:
        """The next finished group, asking for more first if the step's budget allows."""
        while True:
            self._request_more()
            if not self._outstanding:
                return None
            group = await self._groups.get()
            if self._error is not None:
                raise self._error
            if group is not None:
                self._outstanding -= 1
                return group
            # a request ended with groups missing (failed): loop to ask for replacements

    def _request_more(self) -> None:
        """Keep the engine fed group by group, not batch by batch (a step's slowest group
        must not hold back the next step's), within what staleness allows: the groups this
        step still needs (`oversample` times over) plus `max_staleness` steps ahead."""
        budget = math.ceil(self._need * self.oversample) + self.staleness * math.ceil(
            self.groups_per_step * self.oversample
        )
        if self._outstanding >= budget or not self._tasks_left:
            return
        tasks = list(itertools.islice(self.tasks, budget - self._outstanding))
        self._tasks_left = len(tasks) == budget - self._outstanding
        if tasks:
            self._outstanding += len(tasks)
            request = asyncio.create_task(self._sample(tasks))
            self._requests.add(request)
            request.add_done_callback(self._requests.discard)

    async def _sample(self, tasks: list[RolloutTask | dict[str, Any]]) -> None:
        settled = 0  # groups delivered or ended (failed, cancelled as stale)
        try:
            params = self.params.derived(next(self._request_numbers))
            stream = await self.job.rollouts(
                tasks,
                env=self.env,
                group_size=self.group_size,
                params=params,
                **self.rollout_options,
            )
            async for event in stream.events():
                if event.group is not None:
                    settled += 1
                    self._groups.put(event.group)
                elif event.error is not None:
                    settled += 1
                    if event.error.code == STALE_GROUP:
                        self._abandoned += 1
                    else:
                        self._failed += 1
                    self._outstanding -= 1
                    self._groups.put(None)  # wakes the consumer to ask for a replacement
        except Exception as exc:  # e.g. a refused request: the consumer raises it
            self._error = exc
        finally:
            self._outstanding -= len(tasks) - settled
            self._groups.put(None)  # wakes a consumer waiting on groups that never came

    async def _latest(self) -> int:
        try:
            return (await self.job.version("latest")).number
        except NotFound:
            return 0

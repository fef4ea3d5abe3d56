"""`POST /v1/rollouts`: check a request whole before anything runs (a bad environment, bad
params or a prompt that does not fit is a 4xx, not an error half-way through a stream), then
run its groups and stream each as it completes (NDJSON, one `RolloutEvent` per line)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from pydantic import ValidationError

from services.common.errors import InvalidInput, LoomError, invalid_options
from services.common.schemas import ErrorBody
from services.rollout.agent_loop import AgentLoop, GroupVersion, Plan
from services.rollout.environments import Environment, environments
from services.rollout.schemas import (
    STALE_GROUP,
    RenderRequest,
    RenderResponse,
    RolloutEvent,
    RolloutGroup,
    RolloutRequest,
    RolloutSummary,
    Trajectory,
)
from services.rollout.versions import LATEST, Versions

log = logging.getLogger(__name__)


class Rollouts:
    def __init__(self, loop: AgentLoop, versions: Versions) -> None:
        self.loop = loop
        self.versions = versions

    def plan(self, request: RolloutRequest) -> Plan:
        """The checked request, with each task's prompt tokenised once."""
        known = environments()
        env_cls = known.get(request.env)
        if env_cls is None:
            raise InvalidInput(
                f"Unknown environment {request.env!r}; known environments: "
                f"{', '.join(sorted(known))}",
                {"known": sorted(known)},
            )
        try:
            env_params = env_cls.params_model.model_validate(request.env_params)
        except ValidationError as exc:
            raise invalid_options(
                exc, f"Invalid env_params for {request.env!r}", "env_params"
            ) from exc
        if request.version_refresh == "partial" and request.job_id is None:
            raise InvalidInput(
                "version_refresh 'partial' needs a job_id: the base model has no "
                "newer versions to continue on."
            )
        if request.max_staleness is not None and (
            request.job_id is None or request.version_refresh == "turn"
        ):
            raise InvalidInput(
                "max_staleness needs a job_id and version_refresh 'group' or "
                "'partial': a group must start on one version of a job that "
                "publishes newer ones."
            )
        engine = self.loop.sampler.engine
        context = engine.max_model_len
        if request.max_total_tokens is not None and request.max_total_tokens > context:
            raise InvalidInput(
                f"max_total_tokens ({request.max_total_tokens}) exceeds the "
                f"model's context of {context} tokens."
            )
        bad_stops = [t for t in request.params.stop_token_ids if not 0 <= t < engine.vocab_size]
        if bad_stops:
            raise InvalidInput(
                f"stop_token_ids must be in [0, {engine.vocab_size}); got {bad_stops}."
            )
        max_total_tokens = request.max_total_tokens or context
        prompts = [
            self._prompt(index, env_cls(env_params, task), max_total_tokens)
            for index, task in enumerate(request.tasks)
        ]
        return Plan(
            request,
            env_cls,
            env_params,
            request.max_turns or env_cls.max_turns,
            max_total_tokens,
            prompts,
        )

    def _prompt(self, index: int, environment: Environment, max_total_tokens: int) -> list[int]:
        try:
            prompt = self.loop.prompt_ids(environment)
        except ValueError as exc:
            raise InvalidInput(f"tasks[{index}]: {exc}") from exc
        if not prompt or len(prompt) >= max_total_tokens:
            raise InvalidInput(
                f"tasks[{index}]: the prompt is {len(prompt)} tokens; it must "
                f"leave room for a reply within {max_total_tokens}."
            )
        return prompt

    def render(self, request: RenderRequest) -> RenderResponse:
        token_ids, mask = self.loop.chat.conversation(
            [m.model_dump() for m in request.messages], request.tools
        )
        return RenderResponse(token_ids=token_ids, loss_mask=mask)

    async def start(self, request: RolloutRequest) -> AsyncIterator[str]:
        plan = self.plan(request)
        # Resolved now, so an unknown version is a 404 before streaming.
        first = await self.versions.resolve(request.job_id, request.version)
        order = list(range(len(request.tasks)))
        if request.schedule == "longest_prompt_first":
            order.sort(key=lambda i: -len(plan.prompts[i]))
        return self._stream(plan, order, first.number)

    async def _stream(self, plan: Plan, order: list[int], first: int) -> AsyncIterator[str]:
        request = plan.request
        started = time.perf_counter()
        slots = asyncio.Semaphore(request.concurrency)
        events: asyncio.Queue[RolloutEvent] = asyncio.Queue()

        async def group(task_index: int) -> None:
            version = GroupVersion(
                request.version,
                None if request.version_refresh == "turn" else lambda: self._number(request, first),
            )
            try:
                trajectories = await self._unless_stale(
                    request, version, self.loop.run_group(plan, task_index, version, lambda: slots)
                )
                events.put_nowait(
                    RolloutEvent(
                        type="group",
                        group=RolloutGroup(
                            task_index=task_index,
                            task_id=request.tasks[task_index].id,
                            trajectories=trajectories,
                        ),
                    )
                )
            except LoomError as exc:
                events.put_nowait(_error(exc.code, exc.message, task_index))
            except Exception as exc:  # a bug: report it in the stream, keep the other groups
                log.exception("rollout group %d failed", task_index)
                events.put_nowait(
                    _error("internal_error", f"{type(exc).__name__}: {exc}", task_index)
                )

        tasks = [asyncio.create_task(group(i)) for i in order]
        groups = model_tokens = env_tokens = 0
        try:
            for _ in tasks:
                event = await events.get()
                if event.group is not None:
                    groups += 1
                    for trajectory in event.group.trajectories:
                        model_tokens += sum(trajectory.loss_mask)
                        env_tokens += len(trajectory.loss_mask) - sum(trajectory.loss_mask)
                yield event.model_dump_json(exclude_none=True) + "\n"
            summary = RolloutSummary(
                groups=groups,
                trajectories=groups * request.group_size,
                model_tokens=model_tokens,
                env_tokens=env_tokens,
                wall_s=round(time.perf_counter() - started, 3),
            )
            yield (
                RolloutEvent(type="summary", summary=summary).model_dump_json(exclude_none=True)
                + "\n"
            )
        finally:  # the client went away (or we are done): stop what still runs
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _unless_stale(
        self,
        request: RolloutRequest,
        version: GroupVersion,
        group: Coroutine[Any, Any, list[Trajectory]],
    ) -> list[Trajectory]:
        """The group's trajectories, unless the job publishes more than `max_staleness`
        versions after the one the group started on first: then it is cancelled (`Stale`)."""
        if request.max_staleness is None:
            return await group
        assert request.job_id is not None
        running = asyncio.ensure_future(group)
        outdated = asyncio.ensure_future(
            self._outdated(request.job_id, version, request.max_staleness)
        )
        try:
            done, _ = await asyncio.wait([running, outdated], return_when=asyncio.FIRST_COMPLETED)
        finally:
            outdated.cancel()  # nothing if it finished
            running.cancel()
        if running in done:
            return running.result()
        await asyncio.wait([running])  # its cancellation, done
        started, newest = outdated.result()
        raise Stale(
            f"Cancelled: the group started on version {started} and the job has "
            f"published version {newest}, more than max_staleness "
            f"({request.max_staleness}) after it."
        )

    async def _outdated(
        self, job_id: str, version: GroupVersion, max_staleness: int
    ) -> tuple[int, int]:
        """Once the group has started, wait for a version of the job more than
        `max_staleness` after the one it started on: (started, newest)."""
        started = await version.started()
        return started, await self.versions.newer_than(job_id, started + max_staleness)

    async def _number(self, request: RolloutRequest, first: int) -> int:
        """The version a group starts on. A job's `latest` is the newer of what the request
        resolved to when it arrived (asked of modelstate: it sees a publish that returned just
        before) and the newest version modelstate has announced since: no lookup per group.
        Other aliases are looked up."""
        if request.job_id is not None and request.version == LATEST:
            return max(first, self.versions.newest(request.job_id))
        return (await self.versions.resolve(request.job_id, request.version)).number


class Stale(LoomError):
    """A group cancelled by the request's `max_staleness`: its trainer would drop it."""

    status_code = 409
    code = STALE_GROUP


def _error(code: str, message: str, task_index: int) -> RolloutEvent:
    return RolloutEvent(
        type="error", error=ErrorBody(code=code, message=message, detail={"task_index": task_index})
    )

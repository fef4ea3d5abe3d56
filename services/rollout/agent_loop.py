"""Agent loops: one environment episode as tokens, and a group of episodes scored together.

The model's turns are the engine's tokens exactly as sampled (with their logprobs, loss mask
1 and the version that sampled them); the environment's turns are rendered by the chat
template (loss mask 0). Turn and token limits are enforced here, not by environments.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import LoomError
from services.common.schemas import StrictModel
from services.reward.schemas import ScoreItem
from services.rollout.chat_format import ChatFormat
from services.rollout.environments import Environment, Message, Tools
from services.rollout.peers import RewardScorer
from services.rollout.sampling import Sampler
from services.rollout.schemas import (
    RolloutRequest,
    RolloutTask,
    Sample,
    SampleRequest,
    SamplingParams,
    Trajectory,
    TurnInfo,
    VersionRef,
    derive_seed,
)


@dataclass(frozen=True)
class Plan:
    """A checked rollout request: the environment, its params, the limits and each task's
    prompt tokens."""

    request: RolloutRequest
    env_cls: type[Environment]
    env_params: StrictModel
    max_turns: int
    max_total_tokens: int
    prompts: list[list[int]]

    def environment(self, task: RolloutTask) -> Environment:
        return self.env_cls(self.env_params, task)


class GroupVersion:
    """The version a group samples: with refresh 'group' (and 'partial'), `ref` resolved
    once, when the group's first episode starts (not when the request arrived: a group that
    waited for a slot starts on the newest version); with 'turn', `ref` as is, resolved at
    every turn. With 'partial' an episode then moves to each version it is interrupted by."""

    def __init__(self, ref: VersionRef, resolve: Callable[[], Awaitable[int]] | None) -> None:
        self.ref = ref
        self._resolve = resolve
        self._pinned: asyncio.Future[int] | None = None
        self._starting = asyncio.Event()

    async def get(self) -> VersionRef:
        if self._resolve is None:
            return self.ref
        if self._pinned is None:
            self._pinned = asyncio.ensure_future(self._resolve())
            self._starting.set()
        return await asyncio.shield(self._pinned)

    async def started(self) -> int:
        """The version the group started on, once its first episode has started (a group
        that waits for a slot has none yet). Refresh 'turn' pins none: never returns."""
        await self._starting.wait()
        assert self._pinned is not None
        return await asyncio.shield(self._pinned)


@dataclass
class Episode:
    """A trajectory being built: the prompt, then turns appended in order."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[TurnInfo] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0, "env_s": 0.0})

    @property
    def context(self) -> list[int]:
        return [*self.prompt_ids, *self.token_ids]

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.token_ids)

    def add_model_turn(self, parts: list[Sample], text: str) -> None:
        """A model turn: one span per version that sampled part of it (partial rollouts)."""
        for part in parts:
            self._add(
                "model",
                part.token_ids,
                part.logprobs,
                1,
                text if len(parts) == 1 else part.text,
                part.version,
                part.stop_reason,
            )
        self.replies.append(text)

    def add_env_turn(self, token_ids: list[int], text: str) -> None:
        self._add("env", token_ids, [0.0] * len(token_ids), 0, text, None, None)

    def _add(
        self,
        kind: Any,
        token_ids: list[int],
        logprobs: list[float],
        mask: int,
        text: str,
        version: int | None,
        stop_reason: Any,
    ) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(token_ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([mask] * len(token_ids))
        self.turns.append(
            TurnInfo(
                kind=kind,
                start=start,
                end=len(self.token_ids),
                text=text,
                version=version,
                stop_reason=stop_reason,
            )
        )


@dataclass
class Finished:
    episode: Episode
    environment: Environment
    stop_reason: str


class AgentLoop:
    def __init__(self, sampler: Sampler, tools: Tools, scorer: RewardScorer) -> None:
        self.sampler = sampler
        self.tools = tools
        self.scorer = scorer
        self._chat: ChatFormat | None = None

    @property
    def chat(self) -> ChatFormat:
        """Built on first use: the tokenizer exists once the engine has started."""
        if self._chat is None:
            self._chat = ChatFormat(self.sampler.engine.tokenizer)
        return self._chat

    def prompt_ids(self, environment: Environment) -> list[int]:
        if environment.chat:
            return self.chat.prompt_ids(environment.messages(), environment.tools())
        return self.sampler.engine.encode(environment.prompt_text())

    async def run_group(
        self, plan: Plan, task_index: int, version: GroupVersion, slot: Callable[[], Any]
    ) -> list[Trajectory]:
        """`group_size` episodes of one task, then one reward call; `slot` bounds how many
        episodes run at once across the request."""
        task = plan.request.tasks[task_index]

        async def one(sample_index: int) -> Finished:
            async with slot():
                return await self.run_episode(plan, task_index, sample_index, await version.get())

        finished = await asyncio.gather(*(one(i) for i in range(plan.request.group_size)))
        trajectories = [self._trajectory(task_index, i, f) for i, f in enumerate(finished)]
        await self._score(task, finished, trajectories)
        return trajectories

    async def run_episode(
        self, plan: Plan, task_index: int, sample_index: int, version: VersionRef
    ) -> Finished:
        request = plan.request
        environment = plan.environment(request.tasks[task_index])
        started = time.perf_counter()
        episode = Episode(list(plan.prompts[task_index]))
        tools = environment.tools()
        history: list[Message] = environment.messages() if environment.chat else []
        stop_ids = self._stop_ids(environment, request.params.stop_token_ids)
        stop_reason = "max_turns"
        for turn in range(plan.max_turns):
            room = plan.max_total_tokens - episode.length
            if room < 1:
                stop_reason = "max_tokens"
                break
            params = request.params.model_copy(
                update={
                    "max_tokens": min(request.params.max_tokens, room),
                    "stop_token_ids": sorted(stop_ids),
                    "seed": _seed(request.params.seed, task_index, sample_index, turn),
                }
            )
            began = time.perf_counter()
            parts = await self._model_turn(request, episode.context, version, params)
            episode.timings["generate_s"] += time.perf_counter() - began
            sample = joined(parts)
            if request.version_refresh == "partial":
                version = sample.version  # where the turn ended: the newest it heard of
            text = self.chat.reply_text(sample.token_ids, stop_ids)
            episode.add_model_turn(parts, text)
            if sample.stop_reason != "stop":
                budget_bound = params.max_tokens < request.params.max_tokens
                stop_reason = "max_tokens" if budget_bound else sample.stop_reason
                break
            if environment.done(text):
                stop_reason = "done"
                break
            if turn == plan.max_turns - 1:
                break  # out of turns: the environment's answer could not be replied to
            began = time.perf_counter()
            feedback = await environment.step(text, self.tools)
            episode.timings["env_s"] += time.perf_counter() - began
            history.append({"role": "assistant", "content": text})
            feedback_ids = self._feedback_ids(
                environment, history, feedback, tools, sample.token_ids
            )
            history.extend(feedback)
            if episode.length + len(feedback_ids) >= plan.max_total_tokens:
                stop_reason = "max_tokens"  # no room left for the model to answer
                break
            episode.add_env_turn(feedback_ids, self.chat.decode(feedback_ids))
        episode.timings["total_s"] = time.perf_counter() - started
        return Finished(episode, environment, stop_reason)

    async def _model_turn(
        self,
        request: RolloutRequest,
        context: list[int],
        version: VersionRef,
        params: SamplingParams,
    ) -> list[Sample]:
        """One model turn: one sample, or with refresh 'partial', parts: a generation that a
        newer version interrupts continues on it from the tokens it has."""
        sample_request = SampleRequest(
            job_id=request.job_id, version=version, prompt_token_ids=context, params=params
        )
        if request.version_refresh != "partial":
            return (await self.sampler.sample(sample_request)).samples[:1]
        parts: list[Sample] = []
        while True:
            done = [t for part in parts for t in part.token_ids]
            new_parts, newer = await self.sampler.sample_until_newer(
                sample_request.model_copy(
                    update={
                        "prompt_token_ids": [*context, *done],
                        "params": params.model_copy(
                            update={"max_tokens": params.max_tokens - len(done)}
                        ),
                    }
                )
            )
            parts.extend(part for part in new_parts if part.token_ids or newer is None)
            if (
                newer is None
                or len(done) + sum(len(p.token_ids) for p in new_parts) >= params.max_tokens
            ):
                return parts
            sample_request.version = newer  # the number announced: no alias lookup

    def _stop_ids(self, environment: Environment, requested: list[int]) -> set[int]:
        """Tokens that end a model turn: EOS, the template's end of turn, the caller's."""
        tokenizer = self.sampler.engine.tokenizer
        ids = set(requested)
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        if environment.chat and self.chat.turn_end_id is not None:
            ids.add(self.chat.turn_end_id)
        return ids

    def _feedback_ids(
        self,
        environment: Environment,
        history: list[Message],
        feedback: list[Message],
        tools: list[dict[str, Any]],
        reply_ids: list[int],
    ) -> list[int]:
        if not environment.chat:
            return self.chat.encode("".join(str(m["content"]) for m in feedback))
        ended_with_turn_end = bool(reply_ids) and reply_ids[-1] == self.chat.turn_end_id
        return self.chat.feedback_ids(history, feedback, tools, ended_with_turn_end)

    @staticmethod
    def _trajectory(task_index: int, sample_index: int, finished: Finished) -> Trajectory:
        episode = finished.episode
        return Trajectory(
            task_index=task_index,
            sample_index=sample_index,
            prompt_token_ids=episode.prompt_ids,
            token_ids=episode.token_ids,
            logprobs=episode.logprobs,
            loss_mask=episode.loss_mask,
            turns=episode.turns,
            stop_reason=finished.stop_reason,
            response="",
            reward=None,
            timings={k: round(v, 4) for k, v in episode.timings.items()},
        )

    async def _score(
        self, task: RolloutTask, finished: list[Finished], trajectories: list[Trajectory]
    ) -> None:
        """One reward call per verifier (environments name theirs per episode)."""
        by_verifier: dict[tuple[str, str], list[int]] = {}
        scorings = [f.environment.scoring(f.episode.replies) for f in finished]
        for i, scoring in enumerate(scorings):
            trajectories[i].response = scoring.response
            key = (scoring.verifier, json.dumps(scoring.params, sort_keys=True))
            by_verifier.setdefault(key, []).append(i)
        began = time.perf_counter()
        for (verifier, params), members in by_verifier.items():
            items = [
                ScoreItem(response=scorings[i].response, reference=scorings[i].reference)
                for i in members
            ]
            try:
                scores = (await self.scorer.score(verifier, items, json.loads(params))).scores
            except LoomError as exc:
                for i in members:
                    trajectories[i].reward_error = f"{verifier}: {exc.message}"
                continue
            for i, score in zip(members, scores, strict=True):
                trajectories[i].reward = score.reward
                trajectories[i].reward_error = score.error
                trajectories[i].reward_detail = score.detail
        reward_s = round(time.perf_counter() - began, 4)
        for trajectory in trajectories:
            trajectory.timings["reward_s"] = reward_s


def joined(parts: list[Sample]) -> Sample:
    """The parts of a model turn as one sample (the last part's stop reason and version)."""
    return parts[-1].model_copy(
        update={
            "token_ids": [t for part in parts for t in part.token_ids],
            "logprobs": [lp for part in parts for lp in part.logprobs],
            "text": "".join(part.text for part in parts),
        }
    )


def _seed(seed: int | None, task_index: int, sample_index: int, turn: int) -> int | None:
    return None if seed is None else derive_seed(seed, task_index, sample_index, turn)

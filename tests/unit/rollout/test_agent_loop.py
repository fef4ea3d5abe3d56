"""The agent loop and the rollout stream with test doubles for the engine, sandbox and reward
service (the real ones: tests/integration/rollout/test_rollouts.py). The tokenizer and chat
template are the tiny model's own."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from agents.envs.python_tool import PYTHON_TOOL
from services.common.errors import InvalidInput, Unavailable
from services.common.tiny_model import build_tokenizer
from services.reward.schemas import ItemScore, ScoreItem, ScoreResponse
from services.rollout.agent_loop import AgentLoop
from services.rollout.rollouts import Rollouts
from services.rollout.schemas import (
    ChatMessage,
    RenderRequest,
    RolloutEvent,
    RolloutRequest,
    Sample,
    SampleRequest,
    SampleResponse,
)
from services.rollout.tool_calls import format_tool_call
from services.sandbox.schemas import ExecuteResponse, ExecutionStatus

Script = Callable[[SampleRequest, str], str]  # (request, decoded context) -> reply


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory: Path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


class FakeEngine:
    max_model_len = 512

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))


@dataclass
class ScriptedSampler:
    """Replies as the script says, ended with the template's end of turn (or cut at
    max_tokens, as an engine would)."""

    engine: FakeEngine
    script: Script
    requests: list[SampleRequest] = field(default_factory=list)
    # Partial rollouts: the next generations are interrupted after these many tokens by a
    # newer version (one more each time), and continue where they stopped.
    interrupt_after: list[int] = field(default_factory=list)
    rest: list[int] | None = None
    newest: int = 7
    # Partial rollouts on full weights: the next generation moves to the newest version after
    # this many tokens, without stopping.
    move_after: list[int] = field(default_factory=list)

    async def sample_until_newer(self, request: SampleRequest) -> tuple[list[Sample], int | None]:
        self.requests.append(request)
        if self.rest is not None:
            ids, self.rest = self.rest, None
            assert isinstance(request.version, int)
            sample = Sample(
                token_ids=ids,
                logprobs=[-0.25] * len(ids),
                text="",
                stop_reason="stop",
                version=request.version,
            )
        else:
            sample = (await self.sample(request)).samples[0]
            self.requests.pop()
        if self.move_after:
            cuts = [0, *self.move_after, len(sample.token_ids)]
            self.move_after = []
            parts = []
            for start, end in itertools.pairwise(cuts):
                parts.append(
                    sample.model_copy(
                        update={
                            "token_ids": sample.token_ids[start:end],
                            "logprobs": sample.logprobs[start:end],
                            "version": sample.version if start == 0 else self.newest,
                            "stop_reason": sample.stop_reason if end == cuts[-1] else "abort",
                        }
                    )
                )
            return parts, None
        if not self.interrupt_after:
            return [sample], None
        cut = self.interrupt_after.pop(0)
        self.rest = sample.token_ids[cut:]
        part = sample.model_copy(
            update={
                "token_ids": sample.token_ids[:cut],
                "logprobs": sample.logprobs[:cut],
                "stop_reason": "abort",
            }
        )
        self.newest += 1
        return [part], self.newest

    async def sample(self, request: SampleRequest) -> SampleResponse:
        self.requests.append(request)
        assert request.prompt_token_ids is not None
        context = self.engine.tokenizer.decode(request.prompt_token_ids)
        end = "<|im_end|>" if 2 in request.params.stop_token_ids else "<|endoftext|>"
        ids = self.engine.encode(self.script(request, context) + end)
        stop = "stop"
        if len(ids) > request.params.max_tokens:
            ids, stop = ids[: request.params.max_tokens], "length"
        version = request.version if isinstance(request.version, int) else 7
        sample = Sample(
            token_ids=ids, logprobs=[-0.25] * len(ids), text="", stop_reason=stop, version=version
        )
        return SampleResponse(
            job_id=request.job_id,
            version=version,
            prompt_token_ids=request.prompt_token_ids,
            samples=[sample],
        )


@dataclass
class FakeTools:
    status: ExecutionStatus = ExecutionStatus.ok
    fail: bool = False
    programs: list[str] = field(default_factory=list)

    async def run_python(self, code: str, *, timeout_s: float) -> ExecuteResponse:
        if self.fail:
            raise Unavailable("sandbox is unreachable")
        self.programs.append(code)
        # "runs" print(a*b) programs
        stdout = ""
        if code.startswith("print(") and self.status == ExecutionStatus.ok:
            a, b = code[6:-1].split("*")
            stdout = f"{int(a) * int(b)}\n"
        return ExecuteResponse(
            status=self.status,
            exit_code=0,
            stdout=stdout,
            stderr="",
            stdout_truncated=False,
            stderr_truncated=False,
            wall_s=0.01,
            cpu_s=0.01,
        )


class ExactScorer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[ScoreItem], dict[str, Any]]] = []

    async def score(
        self, verifier: str, items: list[ScoreItem], params: dict[str, Any]
    ) -> ScoreResponse:
        self.calls.append((verifier, items, params))
        return ScoreResponse(
            verifier=verifier,
            scores=[ItemScore(reward=float(i.response.strip() == i.reference)) for i in items],
        )


class FakeVersions:
    def __init__(self) -> None:
        self.resolved = 0
        self.announced = 0  # the newest version modelstate's events announced
        self._announcements = asyncio.Condition()

    def newest(self, job_id: str) -> int:
        return self.announced

    async def announce(self, number: int) -> None:
        async with self._announcements:
            self.announced = number
            self._announcements.notify_all()

    async def newer_than(self, job_id: str, number: int) -> int:
        async with self._announcements:
            await self._announcements.wait_for(lambda: self.announced > number)
            return self.announced

    async def resolve(self, job_id: str | None, ref: Any) -> Any:
        self.resolved += 1

        @dataclass
        class Resolved:
            number: int

        return Resolved(3 if ref in ("latest", "best") else int(ref))


def tool_then_answer(request: SampleRequest, context: str) -> str:
    if "<tool_response>" in context:
        return context.rsplit("<tool_response>\n", 1)[1].split("\n", 1)[0]
    question = context.rsplit("What is ", 1)[1].split("?", 1)[0]
    return format_tool_call("python", {"code": f"print({question})"})


def make(
    tokenizer: Any, script: Script, tools: FakeTools | None = None
) -> tuple[Rollouts, ScriptedSampler, FakeTools, ExactScorer, FakeVersions]:
    sampler = ScriptedSampler(FakeEngine(tokenizer), script)
    tools = tools or FakeTools()
    scorer = ExactScorer()
    versions = FakeVersions()
    loop = AgentLoop(sampler, tools, scorer)  # type: ignore[arg-type]
    return Rollouts(loop, versions), sampler, tools, scorer, versions  # type: ignore[arg-type]


def request(**overrides: Any) -> RolloutRequest:
    body: dict[str, Any] = {
        "env": "python_tool",
        "env_params": {"verifier": "exact_match"},
        "tasks": [
            {"prompt": "What is 12*34?", "reference": "408"},
            {"prompt": "What is 7*6?", "reference": "42"},
        ],
        "group_size": 2,
        "params": {"max_tokens": 100, "seed": 5},
    }
    return RolloutRequest.model_validate({**body, **overrides})


async def run(rollouts: Rollouts, body: RolloutRequest) -> list[RolloutEvent]:
    lines = [line async for line in await rollouts.start(body)]
    assert all(line.endswith("\n") for line in lines)
    return [RolloutEvent.model_validate_json(line) for line in lines]


async def test_tool_use_episode_is_token_exact_and_masked(tokenizer: Any) -> None:
    rollouts, sampler, tools, scorer, _ = make(tokenizer, tool_then_answer)
    events = await run(rollouts, request())
    assert [e.type for e in events] == ["group", "group", "summary"]
    groups = {e.group.task_index: e.group for e in events if e.group}
    trajectory = groups[0].trajectories[0]
    assert [t.kind for t in trajectory.turns] == ["model", "env", "model"]
    assert trajectory.stop_reason == "done"
    assert trajectory.response == "408" and trajectory.reward == 1.0
    assert tools.programs.count("print(12*34)") == 2  # both samples of the group
    model, env, answer = trajectory.turns
    assert "<tool_call>" in model.text and model.version == 3
    assert env.text.startswith("\n<|im_start|>user\n<tool_response>\n408\n")
    assert env.text.endswith("<|im_start|>assistant\n")
    # The mask is 1 exactly on the model's tokens (their logprobs kept), 0 on the tool turn.
    for turn in trajectory.turns:
        span = slice(turn.start, turn.end)
        expected = 1 if turn.kind == "model" else 0
        assert set(trajectory.loss_mask[span]) == {expected}
        assert set(trajectory.logprobs[span]) == ({-0.25} if expected else {0.0})
    # The second turn was sampled on exactly prompt + model tokens + tool tokens.
    second = [
        r
        for r in sampler.requests
        if r.prompt_token_ids and len(r.prompt_token_ids) > len(trajectory.prompt_token_ids)
    ]
    contexts = {tuple(r.prompt_token_ids or []) for r in second}
    assert tuple(trajectory.prompt_token_ids + trajectory.token_ids[: env.end]) in contexts
    # Each model turn stops at the template's end of turn, and ends with it.
    assert all(2 in r.params.stop_token_ids for r in sampler.requests)
    assert trajectory.token_ids[model.end - 1] == 2
    # One reward call per group, with the environment's verifier.
    assert len(scorer.calls) == 2 and all(c[0] == "exact_match" for c in scorer.calls)
    summary = events[-1].summary
    assert summary is not None and summary.trajectories == 4
    assert summary.model_tokens == sum(
        sum(t.loss_mask) for g in groups.values() for t in g.trajectories
    )


async def test_seeds_differ_per_trajectory_and_turn(tokenizer: Any) -> None:
    rollouts, sampler, *_ = make(tokenizer, tool_then_answer)
    await run(rollouts, request())
    seeds = [r.params.seed for r in sampler.requests]
    assert len(seeds) == 8 and len(set(seeds)) == 8


async def test_malformed_tool_call_becomes_an_error_turn(tokenizer: Any) -> None:
    def script(request: SampleRequest, context: str) -> str:
        if "<tool_response>" in context:
            return "no idea"
        return '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"\n</tool_call>'

    rollouts, *_ = make(tokenizer, script)
    events = await run(
        rollouts, request(group_size=1, tasks=[{"prompt": "What is 1*1?", "reference": "1"}])
    )
    trajectory = events[0].group.trajectories[0]  # type: ignore[union-attr]
    assert "error: the tool call is not valid JSON" in trajectory.turns[1].text
    assert trajectory.stop_reason == "done" and trajectory.reward == 0.0


async def test_hanging_tool_surfaces_as_a_tool_error(tokenizer: Any) -> None:
    rollouts, *_ = make(tokenizer, tool_then_answer, FakeTools(status=ExecutionStatus.timeout))
    events = await run(rollouts, request(group_size=1))
    turns = events[0].group.trajectories[0].turns  # type: ignore[union-attr]
    assert "error: the program ran past its 5 s limit" in turns[1].text


async def test_turn_limit_ends_an_episode_with_no_answer(tokenizer: Any) -> None:
    def always_call(request: SampleRequest, context: str) -> str:
        return format_tool_call("python", {"code": "print(2*2)"})

    rollouts, *_ = make(tokenizer, always_call)
    events = await run(
        rollouts,
        request(group_size=1, max_turns=3, tasks=[{"prompt": "What is 2*2?", "reference": "4"}]),
    )
    trajectory = events[0].group.trajectories[0]  # type: ignore[union-attr]
    assert trajectory.stop_reason == "max_turns"
    assert [t.kind for t in trajectory.turns] == ["model", "env"] * 2 + ["model"]
    assert trajectory.response == "" and trajectory.reward == 0.0


async def test_token_budget_ends_an_episode(tokenizer: Any) -> None:
    rollouts, *_ = make(tokenizer, tool_then_answer)
    events = await run(rollouts, request(group_size=1, max_total_tokens=100))
    for event in events[:-1]:
        trajectory = event.group.trajectories[0]  # type: ignore[union-attr]
        assert trajectory.stop_reason == "max_tokens"
        assert len(trajectory.prompt_token_ids) + len(trajectory.token_ids) <= 100


async def test_sandbox_outage_fails_only_its_groups(tokenizer: Any) -> None:
    rollouts, *_ = make(tokenizer, tool_then_answer, FakeTools(fail=True))
    events = await run(rollouts, request())
    errors = [e for e in events if e.type == "error"]
    assert len(errors) == 2 and errors[0].error is not None
    assert errors[0].error.code == "unavailable"
    assert {e.error.detail["task_index"] for e in errors if e.error} == {0, 1}
    assert events[-1].summary is not None and events[-1].summary.groups == 0


async def test_group_refresh_resolves_once_per_group_turn_refresh_never(tokenizer: Any) -> None:
    rollouts, sampler, _, _, versions = make(tokenizer, tool_then_answer)
    await run(rollouts, request(version="best"))
    assert versions.resolved == 1 + 2  # the up-front check, then once per group
    assert {r.version for r in sampler.requests} == {3}
    rollouts, sampler, _, _, versions = make(tokenizer, tool_then_answer)
    await run(rollouts, request(version_refresh="turn"))
    assert versions.resolved == 1
    assert {r.version for r in sampler.requests} == {"latest"}


async def test_groups_of_a_jobs_latest_take_the_newest_announced_version(tokenizer: Any) -> None:
    """`latest` is looked up once per request; each group starts on the newer of that and
    the newest version announced since (no lookup per group)."""
    rollouts, sampler, _, _, versions = make(tokenizer, tool_then_answer)
    await run(rollouts, request(job_id="job_1"))
    assert versions.resolved == 1
    assert {r.version for r in sampler.requests} == {3}
    rollouts, sampler, _, _, versions = make(tokenizer, tool_then_answer)
    versions.announced = 5
    await run(rollouts, request(job_id="job_1"))
    assert versions.resolved == 1
    assert {r.version for r in sampler.requests} == {5}


async def test_partial_rollouts_continue_a_turn_on_the_newer_version(tokenizer: Any) -> None:
    """A newer version interrupts the first model turn twice: the turn continues from the
    tokens it has, each part tagged with the version that sampled it, and the episode is the
    same tokens as an uninterrupted one."""
    body = request(
        group_size=1, tasks=[{"prompt": "What is 12*34?", "reference": "408"}], job_id="job_1"
    )
    plain, *_ = make(tokenizer, tool_then_answer)
    (expected,) = (await run(plain, body))[0].group.trajectories  # type: ignore[union-attr]

    rollouts, sampler, tools, *_ = make(tokenizer, tool_then_answer)
    sampler.interrupt_after = [5, 3]
    events = await run(rollouts, body.model_copy(update={"version_refresh": "partial"}))
    (trajectory,) = events[0].group.trajectories  # type: ignore[union-attr]
    assert trajectory.token_ids == expected.token_ids
    assert trajectory.loss_mask == expected.loss_mask
    # The group started on the version `latest` meant (3); versions 8 and 9 interrupted it.
    assert [(t.kind, t.version, t.end - t.start) for t in trajectory.turns][:3] == [
        ("model", 3, 5),
        ("model", 8, 3),
        ("model", 9, expected.turns[0].end - 8),
    ]
    assert [t.stop_reason for t in trajectory.turns[:3]] == ["abort", "abort", "stop"]
    assert tools.programs == ["print(12*34)"]  # the joined turn's tool call ran once
    assert trajectory.reward == 1.0 and trajectory.versions == [3, 8, 9]  # distinct
    # Each continuation samples on the context plus the tokens so far, for what budget is left,
    # on the version number announced (no alias lookup); the next turn stays on the newest.
    first, second, third, answer = sampler.requests
    assert second.prompt_token_ids == [*first.prompt_token_ids, *trajectory.token_ids[:5]]
    assert third.params.max_tokens == first.params.max_tokens - 8
    assert [r.version for r in sampler.requests] == [3, 8, 9, 9]


async def test_partial_rollouts_on_weights_swapped_under_a_turn_keep_one_request(
    tokenizer: Any,
) -> None:
    """Full weights swapped in under a running generation: the turn comes back in parts, one
    per version, with no second request, and the same tokens as an unmoved one."""
    body = request(
        group_size=1, tasks=[{"prompt": "What is 12*34?", "reference": "408"}], job_id="job_1"
    )
    plain, *_ = make(tokenizer, tool_then_answer)
    (expected,) = (await run(plain, body))[0].group.trajectories  # type: ignore[union-attr]

    rollouts, sampler, *_ = make(tokenizer, tool_then_answer)
    sampler.move_after = [4]
    events = await run(rollouts, body.model_copy(update={"version_refresh": "partial"}))
    (trajectory,) = events[0].group.trajectories  # type: ignore[union-attr]
    assert trajectory.token_ids == expected.token_ids
    assert [(t.kind, t.version, t.end - t.start) for t in trajectory.turns][:2] == [
        ("model", 3, 4),
        ("model", 7, expected.turns[0].end - 4),
    ]
    assert len(sampler.requests) == 2  # one per model turn
    assert [r.version for r in sampler.requests] == [3, 7]  # the next turn: the newest


@dataclass
class HeldSampler(ScriptedSampler):
    """Generations whose context holds `held` wait until `release` is set."""

    held: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def sample(self, request: SampleRequest) -> SampleResponse:
        response = await super().sample(request)
        assert request.prompt_token_ids is not None
        if self.held in self.engine.tokenizer.decode(request.prompt_token_ids):
            await self.release.wait()
        return response


async def test_max_staleness_cancels_each_group_by_the_version_it_started_on(
    tokenizer: Any,
) -> None:
    """One group runs at a time (concurrency = group size), max_staleness 1. The first group
    starts on version 3 and its generations are held: version 4 leaves it be, version 5
    cancels it (a 'stale' error). The second group, which waited for the slot, starts on 5
    and is delivered; judged by the version current when the request came (3), it would
    have been cancelled with the first."""
    sampler = HeldSampler(FakeEngine(tokenizer), tool_then_answer, held="12*34")
    versions = FakeVersions()
    rollouts = Rollouts(
        AgentLoop(sampler, FakeTools(), ExactScorer()),  # type: ignore[arg-type]
        versions,
    )  # type: ignore[arg-type]
    body = request(job_id="job_1", max_staleness=1, concurrency=2)
    running = asyncio.ensure_future(run(rollouts, body))
    while len(sampler.requests) < 2:  # both episodes of the first group are generating
        await asyncio.sleep(0)
    await versions.announce(4)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not running.done() and len(sampler.requests) == 2
    await versions.announce(5)
    stale, delivered, summary = await running
    assert stale.error is not None and stale.error.code == "stale"
    assert stale.error.detail == {"task_index": 0}
    assert "started on version 3" in stale.error.message
    assert "published version 5" in stale.error.message
    assert delivered.group is not None and delivered.group.task_index == 1
    assert {v for t in delivered.group.trajectories for v in t.versions} == {5}
    assert summary.summary is not None and summary.summary.groups == 1
    assert not sampler.release.is_set()  # the first group never finished


async def test_without_max_staleness_a_group_outlives_newer_versions(tokenizer: Any) -> None:
    sampler = HeldSampler(FakeEngine(tokenizer), tool_then_answer, held="12*34")
    versions = FakeVersions()
    rollouts = Rollouts(
        AgentLoop(sampler, FakeTools(), ExactScorer()),  # type: ignore[arg-type]
        versions,
    )  # type: ignore[arg-type]
    running = asyncio.ensure_future(run(rollouts, request(job_id="job_1", concurrency=2)))
    while not sampler.requests:
        await asyncio.sleep(0)
    await versions.announce(9)
    sampler.release.set()
    events = await running
    assert [e.type for e in events] == ["group", "group", "summary"]
    assert events[0].group is not None and events[0].group.task_index == 0


async def test_partial_rollouts_need_a_job(tokenizer: Any) -> None:
    rollouts, *_ = make(tokenizer, tool_then_answer)
    with pytest.raises(InvalidInput, match="needs a job_id"):
        await rollouts.start(request(version_refresh="partial"))


async def test_longest_prompt_first_starts_long_prompts_first(tokenizer: Any) -> None:
    rollouts, sampler, *_ = make(tokenizer, lambda r, c: "1")
    tasks = [{"prompt": "1+1=", "reference": "2"}, {"prompt": "12+34=", "reference": "46"}]
    await run(
        rollouts,
        request(
            env="arithmetic",
            env_params={},
            tasks=tasks,
            group_size=1,
            concurrency=1,
            schedule="longest_prompt_first",
        ),
    )
    first = tokenizer.decode(sampler.requests[0].prompt_token_ids)
    assert first == "12+34="


async def test_single_turn_raw_prompt(tokenizer: Any) -> None:
    rollouts, sampler, _, scorer, _ = make(tokenizer, lambda r, c: "46")
    events = await run(
        rollouts,
        request(
            env="arithmetic",
            env_params={},
            group_size=3,
            tasks=[{"prompt": "12+34=", "reference": "46"}],
        ),
    )
    group = events[0].group
    assert group is not None and group.rewards == [1.0, 1.0, 1.0]
    assert tokenizer.decode(group.trajectories[0].prompt_token_ids) == "12+34="
    assert scorer.calls[0][1][0].response == "46"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"env": "chess"},
            "Unknown environment 'chess'; known environments: arithmetic, countdown, python_tool",
        ),
        ({"env_params": {"timeout_s": -1}}, "Invalid env_params for 'python_tool': timeout_s"),
        ({"env_params": {"colour": "red"}}, "colour: Extra inputs"),
        ({"max_total_tokens": 4096}, "exceeds the model's context of 512"),
        ({"params": {"stop_token_ids": [9999]}}, r"stop_token_ids must be in \[0, 271\)"),
        ({"tasks": [{"prompt": "What is " + "9" * 600 + "?"}]}, "tasks\\[0\\]: the prompt is"),
        (
            {
                "env": "arithmetic",
                "env_params": {},
                "tasks": [{"prompt": [{"role": "user", "content": "1+1="}]}],
            },
            "tasks\\[0\\]: the arithmetic environment takes text prompts",
        ),
        ({"max_staleness": 1}, "max_staleness needs a job_id"),
        (
            {"max_staleness": 1, "job_id": "job_1", "version_refresh": "turn"},
            "max_staleness needs a job_id and version_refresh 'group' or 'partial'",
        ),
    ],
)
async def test_bad_requests_are_refused_before_anything_runs(
    tokenizer: Any, overrides: dict[str, Any], message: str
) -> None:
    rollouts, sampler, *_ = make(tokenizer, tool_then_answer)
    with pytest.raises(InvalidInput, match=message):
        await rollouts.start(request(**overrides))
    assert sampler.requests == []


def test_events_are_json_lines() -> None:
    event = RolloutEvent(type="summary")
    assert json.loads(event.model_dump_json(exclude_none=True)) == {"type": "summary"}


async def test_rendered_conversation_matches_the_agent_loops_tokens(tokenizer: Any) -> None:
    """A supervised tool-use example is tokenised exactly as a rollout of it would be."""
    rollouts, *_ = make(tokenizer, tool_then_answer)
    events = await run(rollouts, request(group_size=1))
    trajectory = events[0].group.trajectories[0]  # type: ignore[union-attr]
    task = request().tasks[trajectory.task_index]
    call = format_tool_call("python", {"code": f"print({task.prompt[8:-1]})"})
    rendered = rollouts.render(
        RenderRequest(
            messages=[
                ChatMessage(role="user", content=str(task.prompt)),
                ChatMessage(role="assistant", content=call),
                ChatMessage(role="tool", content=f"{task.reference}\n"),
                ChatMessage(role="assistant", content=str(task.reference)),
            ],
            tools=[PYTHON_TOOL],
        )
    )
    assert rendered.token_ids == trajectory.prompt_token_ids + trajectory.token_ids
    assert rendered.loss_mask == [0] * len(trajectory.prompt_token_ids) + trajectory.loss_mask


def test_render_needs_a_prompt_and_a_reply(tokenizer: Any) -> None:
    rollouts, *_ = make(tokenizer, tool_then_answer)
    with pytest.raises(InvalidInput, match="at least one assistant message"):
        rollouts.render(
            RenderRequest(
                messages=[
                    ChatMessage(role="user", content="a"),
                    ChatMessage(role="user", content="b"),
                ]
            )
        )

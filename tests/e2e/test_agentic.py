"""Agentic rollouts end to end: real vLLM, the real sandbox running the model's tool calls, the
real reward service scoring, through the gateway and the SDK."""

from __future__ import annotations

import pytest

from agents.algorithms import dapo, grpo
from agents.sdk import (
    InvalidInput,
    LoomClient,
    NotFound,
    Pipeline,
    SamplingParams,
)
from services.reward.countdown import reference_of
from services.rollout.tool_calls import format_tool_call
from tests.e2e.conftest import ToolModel

pytestmark = pytest.mark.e2e
GREEDY = SamplingParams(max_tokens=96, temperature=0)


def test_single_turn_groups_stream_with_rewards(stack) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="rollouts-single", mode="lora")
        tasks = [{"id": f"t{a}", "prompt": f"{a}+{a}=", "reference": str(2 * a)} for a in range(6)]
        stream = job.rollouts(
            tasks,
            env="arithmetic",
            group_size=4,
            params=SamplingParams(max_tokens=4, temperature=1.0, seed=1),
            schedule="longest_prompt_first",
        )
        groups = list(stream)
        assert sorted(g.task_id for g in groups) == [f"t{a}" for a in range(6)]
        for group in groups:
            assert len(group.trajectories) == 4
            for trajectory in group.trajectories:
                assert trajectory.reward in (0.0, 1.0) and trajectory.reward_error is None
                assert (
                    len(trajectory.token_ids)
                    == len(trajectory.logprobs)
                    == len(trajectory.loss_mask)
                    <= 4
                )
                assert all(lp <= 0 for lp in trajectory.logprobs)
                assert trajectory.versions == [0] and trajectory.timings["total_s"] > 0
        assert stream.errors == [] and stream.summary.trajectories == 24
        # DAPO's batch from them is valid trainer data
        batch = dapo(max_tokens=4).batch(groups)
        if batch.data:
            assert job.forward_backward(batch.data, dapo(max_tokens=4).loss).result().num_tokens

        countdown = job.rollouts(
            [{"prompt": "3 5 7 -> 22: ", "reference": reference_of([3, 5, 7], 22)}],
            env="countdown",
            group_size=2,
            params=SamplingParams(max_tokens=8),
        )
        events = list(countdown.events())  # every event, the summary included
        assert [e.type for e in events] == ["group", "summary"]
        group = events[0].group
        assert all(t.reward == 0.0 for t in group.trajectories)  # a random model misses


def test_bad_rollout_requests_are_clear_4xx(stack) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="rollouts-bad", mode="lora")
        with pytest.raises(InvalidInput, match="Unknown environment 'chess'.*python_tool"):
            job.rollouts([{"prompt": "1+1="}], env="chess")
        with pytest.raises(InvalidInput, match="timeout_s"):
            job.rollouts([{"prompt": "1+1="}], env="python_tool", env_params={"timeout_s": 0})
        with pytest.raises(NotFound):
            job.rollouts([{"prompt": "1+1="}], env="arithmetic", version=9)
        with pytest.raises(InvalidInput, match="max_staleness needs"):
            job.rollouts(
                [{"prompt": "1+1="}], env="arithmetic", max_staleness=1, version_refresh="turn"
            )


def test_python_tool_episode_runs_the_models_code_in_the_sandbox(
    stack, tool_model: ToolModel
) -> None:
    """Roll out a model taught one tool-use conversation: its tool call runs in the real
    sandbox, the output comes back as a tool turn, its answer is scored."""
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.get_job(tool_model.job_id)
        (group,) = list(
            job.rollouts(
                [{"prompt": tool_model.question, "reference": tool_model.answer}],
                env="python_tool",
                params=GREEDY,
            )
        )
        (trajectory,) = group.trajectories
        kinds = [t.kind for t in trajectory.turns]
        assert kinds == ["model", "env", "model"], [t.text for t in trajectory.turns]
        call, tool, reply = trajectory.turns
        assert call.text == format_tool_call("python", {"code": tool_model.code})
        assert tool.text.startswith(f"\n<|im_start|>user\n<tool_response>\n{tool_model.answer}\n")
        assert {call.version, reply.version} == {tool_model.version}
        assert trajectory.stop_reason == "done"
        assert (trajectory.response, trajectory.reward) == (tool_model.answer, 1.0)
        # The loop's tokens are the rendered conversation's: what SFT taught is what ran.
        assert trajectory.prompt_token_ids + trajectory.token_ids == tool_model.token_ids
        assert trajectory.loss_mask == tool_model.loss_mask[len(trajectory.prompt_token_ids) :]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pipeline_steps_publish_versions_within_the_staleness_bound(stack, mode: str) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name=f"pipeline-{mode}", mode="lora")
        tasks = [
            {"prompt": f"{a}+{b}=", "reference": str(a + b)} for a in range(10) for b in range(10)
        ]
        pipeline = Pipeline(
            job,
            grpo(),
            env="arithmetic",
            tasks=tasks,
            groups_per_step=4,
            group_size=4,
            params=SamplingParams(max_tokens=4),
            mode=mode,
            max_staleness=1,
        )
        results = list(pipeline.run(3))
        assert [r.version for r in results] == [1, 2, 3]
        assert all(r.groups == 4 and r.failed_groups == 0 for r in results)
        assert all(r.max_staleness <= (1 if mode == "async" else 0) for r in results)
        assert [v.number for v in job.versions()] == [1, 2, 3]

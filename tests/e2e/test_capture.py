"""A black-box agent written against the OpenAI SDK (the real `openai` package), pointed at a
Loom capture session: its tool calls run in the real sandbox, every call is recorded, and the
recording is a training sequence token for token."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from agents.algorithms import trajectory_datum
from agents.envs.python_tool import PYTHON_TOOL
from agents.sdk import LoomClient, LossConfig, NotFound
from tests.e2e.conftest import ToolModel

pytestmark = pytest.mark.e2e


def run_agent(
    agent: openai.OpenAI, loom: LoomClient, question: str, stream: bool = False
) -> tuple[list[dict[str, Any]], list[str | None]]:
    """A plain OpenAI tool-use loop, as an agent framework would write it: the messages, and
    each response's finish reason."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    finishes: list[str | None] = []
    for _ in range(3):
        if stream:
            message, finish = streamed_reply(agent, messages)
        else:
            response = agent.chat.completions.create(
                model="any-model-name",
                messages=messages,
                tools=[PYTHON_TOOL],
                temperature=0,
                max_tokens=96,
            )
            message = response.choices[0].message.model_dump(exclude_none=True)
            finish = response.choices[0].finish_reason
        messages.append(message)
        finishes.append(finish)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            code = json.loads(call["function"]["arguments"])["code"]
            output = loom.execute(code)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output.stdout})
    return messages, finishes


def streamed_reply(
    agent: openai.OpenAI, messages: list[dict[str, Any]]
) -> tuple[dict[str, Any], str | None]:
    content, calls, finish = "", {}, None
    for chunk in agent.chat.completions.create(
        model="any-model-name",
        messages=messages,
        tools=[PYTHON_TOOL],
        temperature=0,
        max_tokens=96,
        stream=True,
    ):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                calls[call.index] = call.model_dump(exclude_none=True, exclude={"index"})
            finish = choice.finish_reason or finish
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_agent_is_captured_token_for_token(
    stack, tool_model: ToolModel, stream: bool
) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.get_job(tool_model.job_id)
        capture = job.capture(metadata={"task": "123*45"})
        agent = openai.OpenAI(base_url=capture.openai_base_url, api_key=capture.api_key)
        messages, finishes = run_agent(agent, loom, tool_model.question, stream=stream)

        assert finishes == ["tool_calls", "stop"]
        assert messages[1]["tool_calls"][0]["function"]["name"] == "python"
        assert messages[2]["content"] == f"{tool_model.answer}\n"  # the sandbox ran it
        assert messages[3]["content"] == tool_model.answer

        captured = capture.fetch()
        assert captured.trajectory.metadata == {"task": "123*45"}
        assert captured.trajectory.calls == 2
        first, second = captured.calls
        assert (first.parent, second.parent) == (None, 0)
        assert {first.version, second.version} == {tool_model.version}
        (segment,) = captured.segments
        # Exactly the conversation the model was taught: the model's tokens as sampled, the
        # tool's turn rendered by the template, and the loss on the model's tokens only.
        assert segment.prompt_token_ids + segment.token_ids == tool_model.token_ids
        assert segment.loss_mask == tool_model.loss_mask[len(segment.prompt_token_ids) :]
        assert [t.kind for t in segment.turns] == ["model", "env", "model"]
        assert all(lp <= 0 for lp in segment.logprobs)
        datum = trajectory_datum(segment, advantage=1.0)
        result = job.forward_backward([datum], LossConfig(name="importance_sampling")).result()
        assert result.num_tokens == sum(segment.loss_mask)

        capture.delete()
        with pytest.raises(NotFound, match="does not exist"):
            capture.fetch()


def test_unknown_trajectories_and_versions_are_clear_errors(stack, tool_model: ToolModel) -> None:
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        capture = loom.capture(job_id=tool_model.job_id)
        capture.delete()
        agent = openai.OpenAI(base_url=capture.openai_base_url, api_key=key)
        with pytest.raises(openai.NotFoundError, match="create one with POST"):
            agent.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(NotFound):
            loom.capture(job_id=tool_model.job_id, version=99)
        live = loom.capture(job_id=tool_model.job_id)
        agent = openai.OpenAI(base_url=live.openai_base_url, api_key=key)
        with pytest.raises(openai.UnprocessableEntityError, match="cannot force a tool call"):
            agent.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "x"}],
                tools=[PYTHON_TOOL],
                tool_choice="required",
            )
        assert live.fetch().calls == []  # a refused call records nothing

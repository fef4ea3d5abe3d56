"""Environments and tool-call parsing as plain objects."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.envs.python_tool import PythonToolEnv, PythonToolParams
from services.rollout.environments import ENTRY_POINT_GROUP, environments
from services.rollout.schemas import RolloutTask
from services.rollout.tool_calls import ToolCall, ToolCallError, format_tool_call, parse_tool_calls
from services.sandbox.schemas import ExecuteResponse, ExecutionStatus


def test_parse_well_formed_calls_in_order() -> None:
    text = (
        "Let me compute. "
        + format_tool_call("python", {"code": "print(1)"})
        + format_tool_call("python", {"code": "print(2)"})
    )
    assert parse_tool_calls(text) == [
        ToolCall("python", {"code": "print(1)"}),
        ToolCall("python", {"code": "print(2)"}),
    ]
    assert parse_tool_calls("no calls here") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>["python"]</tool_call>', 'JSON object {"name"'),
        ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "python", "arguments": {}}', "was not closed"),
    ],
)
def test_malformed_calls_are_explained(text: str, message: str) -> None:
    (call,) = parse_tool_calls(text)
    assert isinstance(call, ToolCallError) and message in call.message


def test_arguments_encoded_twice_are_accepted() -> None:
    text = '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(3)\\"}"}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("python", {"code": "print(3)"})]


@dataclass
class Tools:
    response: ExecuteResponse

    async def run_python(self, code: str, *, timeout_s: float) -> ExecuteResponse:
        return self.response


def result(status: ExecutionStatus, stdout: str = "", stderr: str = "") -> ExecuteResponse:
    return ExecuteResponse(
        status=status,
        exit_code=1,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=False,
        stderr_truncated=False,
        wall_s=0.1,
        cpu_s=0.1,
    )


def env(**params: object) -> PythonToolEnv:
    return PythonToolEnv(
        PythonToolParams.model_validate(params), RolloutTask(prompt="What is 2*3?", reference="6")
    )


async def test_python_tool_reports_errors_to_the_model() -> None:
    failing = Tools(result(ExecutionStatus.error, stderr="ZeroDivisionError: division by zero"))
    calls = (
        format_tool_call("python", {"code": "1/0"})
        + format_tool_call("shell", {})
        + format_tool_call("python", {"code": " "})
    )
    messages = await env().step(calls, failing)
    assert [m["role"] for m in messages] == ["tool"] * 3
    assert messages[0]["content"].startswith("error (error, exit code 1):\nZeroDivisionError")
    assert "unknown tool 'shell'" in messages[1]["content"]
    assert "non-empty string argument 'code'" in messages[2]["content"]


async def test_python_tool_limits_calls_and_output() -> None:
    chatty = Tools(result(ExecutionStatus.ok, stdout="x" * 100))
    calls = format_tool_call("python", {"code": "print('x' * 100)"}) * 3
    messages = await env(max_calls_per_turn=2, max_output_chars=16).step(calls, chatty)
    assert len(messages) == 3
    assert messages[0]["content"] == "x" * 16 + "\n[output cut]"
    assert "at most 2 tool calls per turn" in messages[2]["content"]


def test_python_tool_final_answer_and_scoring() -> None:
    python_tool = env()
    assert not python_tool.done(format_tool_call("python", {"code": "print(6)"}))
    assert python_tool.done("6")
    scoring = python_tool.scoring([format_tool_call("python", {"code": "print(6)"}), "6"])
    assert (scoring.verifier, scoring.response, scoring.reference) == ("math", "6", "6")
    # out of turns on a tool call: no answer, even if the code mentions the right number
    assert python_tool.scoring([format_tool_call("python", {"code": "print(6)"})]).response == ""


def test_builtin_environments_are_registered() -> None:
    assert {"arithmetic", "countdown", "python_tool"} <= set(environments())
    for cls in environments().values():
        assert cls.description and cls.max_turns >= 1


class ShadowEnv(PythonToolEnv):
    """A third party's environment that tries to take a built-in's name."""


def test_a_plugin_adds_environments_but_cannot_shadow_a_builtin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found through the entry points of an installed distribution (a real dist-info on the
    path), as `pip install my-env-package` would register it."""
    info = tmp_path / "my_envs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\npython_tool = {__name__}:ShadowEnv\n"
        f"my_tool = {__name__}:ShadowEnv\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    environments.cache_clear()
    try:
        found = environments()
    finally:
        environments.cache_clear()
    assert found["my_tool"] is ShadowEnv
    assert found["python_tool"] is PythonToolEnv

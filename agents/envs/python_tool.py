"""Multi-turn tool use: the model may call a `python` tool (Qwen-style `<tool_call>`), the
sandbox service runs the code and its output comes back as a `tool` message; a turn without a
tool call is the final answer, scored by the `math` verifier against the reference."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.common.schemas import StrictModel
from services.rollout.environments import Environment, Message, Scoring, Tools
from services.rollout.tool_calls import ToolCall, ToolCallError, parse_tool_calls
from services.sandbox.schemas import ExecutionStatus

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program in a sandbox and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program"}},
            "required": ["code"],
        },
    },
}


class PythonToolParams(StrictModel):
    timeout_s: float = Field(default=5.0, gt=0, le=60, description="Per program")
    max_output_chars: int = Field(
        default=2000, ge=16, le=100_000, description="Tool output kept (the rest is cut)"
    )
    max_calls_per_turn: int = Field(default=4, ge=1, le=16)
    verifier: str = Field(default="math", description="Scores the final answer")


class PythonToolEnv(Environment):
    name = "python_tool"
    description = (
        "Multi-turn: the model may run Python in the sandbox (tool `python`, "
        "argument `code`) before it answers; the last turn is scored."
    )
    params_model = PythonToolParams
    params: PythonToolParams
    max_turns = 4

    def tools(self) -> list[dict[str, Any]]:
        return [PYTHON_TOOL]

    def done(self, reply: str) -> bool:
        return not parse_tool_calls(reply)

    async def step(self, reply: str, tools: Tools) -> list[Message]:
        calls = parse_tool_calls(reply)
        limit = self.params.max_calls_per_turn
        results = [await self._run(call, tools) for call in calls[:limit]]
        if len(calls) > limit:
            results.append(f"error: at most {limit} tool calls per turn; the rest were skipped")
        return [{"role": "tool", "content": result} for result in results]

    async def _run(self, call: ToolCall | ToolCallError, tools: Tools) -> str:
        if isinstance(call, ToolCallError):
            return f"error: {call.message}"
        if call.name != "python":
            return f"error: unknown tool {call.name!r}; the only tool is 'python'"
        code = call.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return "error: the python tool needs a non-empty string argument 'code'"
        result = await tools.run_python(code, timeout_s=self.params.timeout_s)
        if result.status == ExecutionStatus.timeout:
            return f"error: the program ran past its {self.params.timeout_s:g} s limit"
        output = (
            result.stdout
            if result.status == ExecutionStatus.ok
            else (
                f"error ({result.status.value}, exit code {result.exit_code}):\n"
                f"{result.stderr[-self.params.max_output_chars :]}"
            )
        )
        return self._cut(output)

    def _cut(self, text: str) -> str:
        limit = self.params.max_output_chars
        return text if len(text) <= limit else text[:limit] + "\n[output cut]"

    def scoring(self, replies: list[str]) -> Scoring:
        # An episode that ends on a tool call (out of turns) has given no answer.
        answer = "" if parse_tool_calls(replies[-1]) else replies[-1]
        return Scoring(self.params.verifier, answer, self.task.reference, {})

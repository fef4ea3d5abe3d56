"""Tool calls in the Qwen / Hermes chat format: the model writes

    <tool_call>
    {"name": "python", "arguments": {"code": "print(6 * 7)"}}
    </tool_call>

and the environment answers with a `tool` message per call. A malformed call is not a crash:
it becomes a `ToolCallError` the environment reports back to the model as a tool message.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    message: str


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every `<tool_call>` block of `text` in order, each parsed or explained."""
    calls: list[ToolCall | ToolCallError] = [_parse(m.group(1)) for m in _BLOCK.finditer(text)]
    if text.count(OPEN) > len(calls):
        calls.append(ToolCallError(f"a {OPEN} was not closed with {CLOSE}"))
    return calls


def _parse(body: str) -> ToolCall | ToolCallError:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCallError(f"the tool call is not valid JSON: {exc.msg} (at char {exc.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCallError('a tool call is a JSON object {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments JSON-encoded twice
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCallError(f"the arguments of {call['name']!r} must be a JSON object")
    return ToolCall(call["name"], arguments)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the model should write it (used to build supervised examples)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"

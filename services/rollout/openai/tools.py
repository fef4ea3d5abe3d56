"""Tool calls on the OpenAI wire and in the model's chat template.

Requests carry calls as OpenAI does (`arguments` a JSON string); chat templates (Qwen, Hermes,
Llama 3) take them as Hugging Face does (`arguments` a dict). Replies are parsed from the
model's `<tool_call>` blocks, as the environments parse them (`services/rollout/tool_calls.py`).
A reply whose blocks do not all parse is returned as plain content, as vLLM's Hermes parser
does, so the agent sees what the model wrote.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidInput
from services.rollout.chat_format import Message
from services.rollout.openai.schemas import (
    ChatMessage,
    FunctionCall,
    ToolCallDelta,
    ToolCallOut,
    ToolDef,
)
from services.rollout.tool_calls import OPEN, ToolCall, parse_tool_calls


def template_messages(messages: list[ChatMessage]) -> list[Message]:
    """The request's messages as a chat template takes them."""
    return [template_message(m, i) for i, m in enumerate(messages)]


def template_message(message: ChatMessage, index: int = 0) -> Message:
    rendered: Message = {"role": message.role, "content": message.text}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call, index)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


def template_tools(tools: list[ToolDef] | None) -> list[dict[str, Any]] | None:
    return [tool.model_dump(exclude_none=True) for tool in tools] if tools else None


def _arguments(call: ToolCallOut, index: int) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"messages[{index}]: the arguments of tool call {call.id!r} are not valid JSON "
            f"({exc.msg} at char {exc.pos}); send them as OpenAI returned them."
        ) from exc
    if not isinstance(arguments, dict):
        raise InvalidInput(
            f"messages[{index}]: the arguments of tool call {call.id!r} must be a JSON object."
        )
    return arguments


@dataclass(frozen=True)
class Reply:
    """A model turn as OpenAI returns it: text, tool calls, or both."""

    content: str | None
    tool_calls: list[ToolCallOut]

    def template_message(self) -> Message:
        """The assistant message an agent sends back for this reply, as the template takes
        it (what a later request's history is compared with)."""
        return template_message(
            ChatMessage(role="assistant", content=self.content, tool_calls=self.tool_calls or None)
        )


def split_reply(text: str, tools_offered: bool) -> Reply:
    if not tools_offered or OPEN not in text:
        return Reply(text, [])
    parsed = parse_tool_calls(text)
    if not parsed or not all(isinstance(call, ToolCall) for call in parsed):
        return Reply(text, [])
    calls = [
        ToolCallOut(
            id=f"call_{uuid.uuid4().hex[:24]}",
            function=FunctionCall(name=call.name, arguments=json.dumps(call.arguments)),
        )
        for call in parsed
        if isinstance(call, ToolCall)
    ]
    content = text[: text.index(OPEN)].strip()
    return Reply(content or None, calls)


class ReplyStream:
    """Content deltas of a streamed reply, holding back everything from the first
    `<tool_call>` on (and any tail that could be its start), so tool calls are sent whole
    once the reply is complete, never as raw markup."""

    def __init__(self, tools_offered: bool) -> None:
        self.tools_offered = tools_offered
        self.text = ""
        self.sent = 0

    def push(self, delta: str) -> str:
        self.text += delta
        if not self.tools_offered:
            return self._send(len(self.text))
        marker = self.text.find(OPEN)
        if marker >= 0:
            return self._send(marker)
        return self._send(len(self.text) - _partial_marker(self.text))

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """The content still held back and the tool calls, once the reply is complete."""
        reply = split_reply(self.text, self.tools_offered)
        if not reply.tool_calls:
            return self._send(len(self.text)), []
        return "", [
            ToolCallDelta(index=i, **call.model_dump()) for i, call in enumerate(reply.tool_calls)
        ]

    def _send(self, upto: int) -> str:
        upto = max(upto, self.sent)
        delta, self.sent = self.text[self.sent : upto], upto
        return delta


def _partial_marker(text: str) -> int:
    """How many characters at the end of `text` could begin `<tool_call>`."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0

"""Token-level conversations with a model's own chat template.

Multi-turn rollouts are built token by token: the model's turns are kept exactly as sampled
(re-tokenising decoded text can change the tokens, and then the logprobs no longer describe
what is trained), and only the environment's turns are rendered and tokenised. What text an
environment turn needs comes from the template itself: render the conversation with a
placeholder for the last model turn, with and without the new messages, and take the
difference, so any template that only appends (ChatML, Qwen, Llama 3, ...) works unchanged.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidInput

Message = dict[str, Any]
PLACEHOLDER = "\ue000"  # a private-use character: no real reply contains it


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        probe = self.render(
            [{"role": "user", "content": "?"}, {"role": "assistant", "content": PLACEHOLDER}]
        )
        # What the template writes after a model turn, e.g. "<|im_end|>\n".
        self.turn_closing = probe.rsplit(PLACEHOLDER, 1)[1]
        closing_ids = self.encode(self.turn_closing)
        special = set(tokenizer.all_special_ids)
        # The model ends its turn with this token: sampling stops there.
        self.turn_end_id: int | None = (
            closing_ids[0] if closing_ids and closing_ids[0] in special else None
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools or None,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                )
            )
        except Exception as exc:  # jinja raises whatever the template's author chose
            raise InvalidInput(
                f"The model's chat template cannot render these messages: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def reply_text(self, token_ids: list[int], stop_ids: set[int]) -> str:
        """A model turn as text, without the token that ended it."""
        if token_ids and token_ids[-1] in stop_ids:
            token_ids = token_ids[:-1]
        return self.decode(token_ids)

    def feedback_ids(
        self,
        history: list[Message],
        feedback: list[Message],
        tools: list[dict[str, Any]] | None,
        ended_with_turn_end: bool,
    ) -> list[int]:
        """Tokens between a model turn (the last message of `history`) and the next one:
        the rest of the turn's closing, `feedback`, and the generation prompt."""
        earlier = [*history[:-1], {"role": "assistant", "content": PLACEHOLDER}]
        before = self.render(earlier, tools)
        after = self.render([*earlier, *feedback], tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise InvalidInput(
                "The model's chat template rewrites earlier turns when messages "
                "are added, so multi-turn rollouts cannot extend its tokens."
            )
        closing = before.rsplit(PLACEHOLDER, 1)[1]
        if ended_with_turn_end and self.turn_end_id is not None:
            closing = closing.removeprefix(self.decode([self.turn_end_id]))
        return self.encode(closing + after[len(before) :])

    def conversation(
        self, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> tuple[list[int], list[int]]:
        """A whole conversation as the agent loop would have built it, with loss mask 1 on
        the assistant's tokens (each turn's content and its end-of-turn token): supervised
        examples for multi-turn tool use."""
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None or first == 0:
            raise InvalidInput(
                "A conversation to render needs a prompt (at least one message) "
                "followed by at least one assistant message."
            )
        token_ids = self.prompt_ids(messages[:first], tools)
        mask = [0] * len(token_ids)
        history = list(messages[:first])
        i = first
        while i < len(messages):
            reply = self.encode(str(messages[i]["content"]))
            if self.turn_end_id is not None:
                reply.append(self.turn_end_id)
            token_ids += reply
            mask += [1] * len(reply)
            history.append(messages[i])
            after = next(
                (j for j in range(i + 1, len(messages)) if messages[j]["role"] == "assistant"),
                len(messages),
            )
            if after < len(messages):  # the environment's turn before the next reply
                feedback = messages[i + 1 : after]
                between = self.feedback_ids(
                    history, feedback, tools, ended_with_turn_end=self.turn_end_id is not None
                )
                token_ids += between
                mask += [0] * len(between)
                history.extend(feedback)
            i = after
        return token_ids, mask

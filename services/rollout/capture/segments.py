"""How recorded calls fit together: which earlier call a new call continues, and the chains
of calls as training sequences.

A chat call continues an earlier one when its messages are that call's messages, then that
call's reply, then only non-assistant messages (tool results, the user): its prompt is then
built from the earlier call's tokens exactly as sampled plus the new messages rendered by the
template, so the model's tokens are never re-tokenised. A completions call continues an
earlier one when its prompt tokens start with that call's prompt and completion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from services.rollout.capture.store import StoredCall
from services.rollout.chat_format import ChatFormat, Message
from services.rollout.schemas import CapturedSegment, TurnInfo


def chat_parent(
    calls: Sequence[StoredCall], messages: list[Message], tools: list[dict[str, Any]] | None
) -> StoredCall | None:
    """The latest chat call that `messages` continue, if any."""
    for call in reversed(calls):
        if call.messages is None or call.reply is None or call.tools != tools:
            continue
        n = len(call.messages)
        if (
            len(messages) > n
            and messages[:n] == call.messages
            and messages[n] == call.reply
            and all(m["role"] != "assistant" for m in messages[n + 1 :])
        ):
            return call
    return None


def continued_prompt(
    chat: ChatFormat,
    parent: StoredCall,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
) -> list[int]:
    """The prompt of a call that continues `parent`: its tokens, then the new messages."""
    assert parent.messages is not None and parent.reply is not None
    n = len(parent.messages)
    ended = bool(parent.token_ids) and parent.token_ids[-1] == chat.turn_end_id
    between = chat.feedback_ids(
        [*parent.messages, parent.reply], messages[n + 1 :], tools, ended_with_turn_end=ended
    )
    return [*parent.sequence, *between]


def token_parent(calls: Sequence[StoredCall], prompt: list[int]) -> StoredCall | None:
    """The call with the longest prompt + completion that `prompt` starts with."""
    best: StoredCall | None = None
    for call in calls:
        sequence = call.sequence
        if (
            len(sequence) <= len(prompt)
            and prompt[: len(sequence)] == sequence
            and (best is None or len(sequence) > len(best.sequence))
        ):
            best = call
    return best


def segments(
    calls: Sequence[StoredCall], decode: Callable[[list[int]], str]
) -> list[CapturedSegment]:
    """One training sequence per chain of calls, ending at each call nothing continues."""
    by_index = {call.index: call for call in calls}
    continued = {call.parent for call in calls if call.parent is not None}
    return [
        _segment(_chain(leaf, by_index), decode) for leaf in calls if leaf.index not in continued
    ]


def _chain(leaf: StoredCall, by_index: dict[int, StoredCall]) -> list[StoredCall]:
    chain = [leaf]
    while chain[-1].parent is not None and chain[-1].parent in by_index:
        chain.append(by_index[chain[-1].parent])
    return chain[::-1]


def _segment(chain: list[StoredCall], decode: Callable[[list[int]], str]) -> CapturedSegment:
    root = chain[0]
    tokens: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    turns: list[TurnInfo] = []

    def add(ids: list[int], lps: list[float], call: StoredCall | None) -> None:
        """A model turn (`call`) or, with no call, the context added between turns."""
        if not ids:
            return
        start = len(tokens)
        tokens.extend(ids)
        logprobs.extend(lps)
        mask.extend([1 if call else 0] * len(ids))
        turns.append(
            TurnInfo(
                kind="model" if call else "env",
                start=start,
                end=len(tokens),
                text=call.text if call else decode(ids),
                version=call.version if call else None,
                stop_reason=call.finish_reason if call else None,
            )
        )  # type: ignore[arg-type]

    previous: StoredCall | None = None
    for call in chain:
        if previous is not None:
            added = call.prompt_token_ids[len(previous.sequence) :]
            add(added, [0.0] * len(added), None)
        add(call.token_ids, call.logprobs, call)
        previous = call
    return CapturedSegment(
        prompt_token_ids=root.prompt_token_ids,
        token_ids=tokens,
        logprobs=logprobs,
        loss_mask=mask,
        turns=turns,
        calls=[call.index for call in chain],
    )

"""Trajectory capture without an engine: the store on both databases, how calls chain into
training segments (token-exact continuation of chat calls with the tiny model's template),
and OpenAI tool calls parsed from and rendered into the model's format."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine

from services.common.db import make_sessionmaker
from services.common.errors import InvalidInput, NotFound
from services.common.tiny_model import build_tokenizer
from services.rollout.app import ALEMBIC_DIR, VERSION_TABLE
from services.rollout.capture import NewCall, Recording, TrajectoryStore
from services.rollout.capture.models import Base
from services.rollout.capture.segments import segments
from services.rollout.capture.store import StoredCall
from services.rollout.chat_format import ChatFormat
from services.rollout.openai.schemas import ChatCompletionRequest, ChatMessage
from services.rollout.openai.tools import (
    ReplyStream,
    split_reply,
    template_messages,
)
from services.rollout.schemas import TrajectoryCreate
from tests.conftest import migrated_engine

TOOLS = [{"type": "function", "function": {"name": "python"}}]
CALL_TEXT = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'


@pytest.fixture
def engine(database_url: str) -> Any:
    yield from migrated_engine(database_url, ALEMBIC_DIR, VERSION_TABLE)


@pytest.fixture
def store(engine: Engine) -> TrajectoryStore:
    return TrajectoryStore(make_sessionmaker(engine))


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> ChatFormat:
    from transformers import AutoTokenizer

    directory: Path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return ChatFormat(AutoTokenizer.from_pretrained(directory))


def new_call(
    prompt: list[int], tokens: list[int], parent: int | None = None, **fields: Any
) -> NewCall:
    return NewCall(
        endpoint="completions",
        version=1,
        prompt_token_ids=prompt,
        token_ids=tokens,
        logprobs=[-0.5] * len(tokens),
        finish_reason="stop",
        text="t",
        parent=parent,
        **fields,
    )


def stored(
    index: int, prompt: list[int], tokens: list[int], parent: int | None = None, **fields: Any
) -> StoredCall:
    return StoredCall(index=index, **vars(new_call(prompt, tokens, parent, **fields)))


# --- the store ---------------------------------------------------------------------------


def test_migrations_match_the_models(empty_database_url: str) -> None:
    for engine in migrated_engine(empty_database_url, ALEMBIC_DIR, VERSION_TABLE):
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, Base.metadata) == []


def test_calls_are_kept_in_order_and_deleted_with_their_trajectory(store: TrajectoryStore) -> None:
    info = store.create(TrajectoryCreate(job_id="job_1", version=3, metadata={"task": 7}))
    assert info.id.startswith("traj_") and info.version == 3 and info.calls == 0
    assert store.add(info.id, [new_call([1, 2], [3]), new_call([1, 2], [4])]) == [0, 1]
    assert store.add(info.id, [new_call([1, 2, 3, 9], [5], parent=0)]) == [2]
    calls = store.calls(info.id)
    assert [(c.index, c.parent, c.token_ids) for c in calls] == [
        (0, None, [3]),
        (1, None, [4]),
        (2, 0, [5]),
    ]
    assert store.info(info.id).calls == 3 and store.info(info.id).metadata == {"task": 7}
    store.delete(info.id)
    for operation in (store.info, store.calls, store.delete):
        with pytest.raises(NotFound, match="create one with POST /v1/trajectories"):
            operation(info.id)
    with pytest.raises(NotFound):
        store.add(info.id, [new_call([1], [2])])


def test_sampled_text_with_a_nul_character_is_kept_on_both_databases(
    store: TrajectoryStore,
) -> None:
    """A byte-level tokenizer has a token for byte 0; PostgreSQL text cannot hold it (it
    failed a compose demo with a 500), so it is stored as U+FFFD while the token ids stay."""
    info = store.create(TrajectoryCreate())
    call = new_call([1], [0, 5])
    store.add(info.id, [NewCall(**{**vars(call), "text": "a\x00b"})])
    [kept] = store.calls(info.id)
    assert (kept.text, kept.token_ids) == ("a\ufffdb", [0, 5])


def test_concurrent_calls_get_distinct_indexes(store: TrajectoryStore) -> None:
    info = store.create(TrajectoryCreate())
    with ThreadPoolExecutor(8) as pool:
        indexes = list(pool.map(lambda i: store.add(info.id, [new_call([i], [i])])[0], range(24)))
    assert sorted(indexes) == list(range(24))
    assert sorted(c.token_ids[0] for c in store.calls(info.id)) == list(range(24))


# --- chaining and segments ---------------------------------------------------------------


def test_segments_follow_each_branch_with_model_tokens_masked_in() -> None:
    calls = [
        stored(0, [1, 2], [3, 4]),
        stored(1, [1, 2, 3, 4, 8, 9], [5], parent=0),  # the agent added [8, 9]
        stored(2, [1, 2, 3, 4, 7], [6, 6], parent=0),  # a second branch from call 0
        stored(3, [42], [43]),  # unrelated
    ]
    first, second, third = segments(calls, decode=lambda ids: f"<{len(ids)} tokens>")
    assert first.calls == [0, 1] and first.prompt_token_ids == [1, 2]
    assert first.token_ids == [3, 4, 8, 9, 5]
    assert first.loss_mask == [1, 1, 0, 0, 1]
    assert first.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert [(t.kind, t.start, t.end) for t in first.turns] == [
        ("model", 0, 2),
        ("env", 2, 4),
        ("model", 4, 5),
    ]
    assert first.turns[1].text == "<2 tokens>" and first.versions == [1]
    assert second.calls == [0, 2] and second.token_ids == [3, 4, 7, 6, 6]
    assert third.calls == [3] and third.token_ids == [43]


def recording(calls: list[StoredCall]) -> Recording:
    from datetime import UTC, datetime

    from services.rollout.schemas import TrajectoryInfo

    info = TrajectoryInfo(
        id="traj_x",
        job_id=None,
        version="latest",
        metadata={},
        created_at=datetime.now(UTC),
        calls=len(calls),
    )
    return Recording(store=None, info=info, calls=calls)  # type: ignore[arg-type]


def test_a_tool_result_continues_the_call_token_for_token(chat: ChatFormat) -> None:
    """The next prompt is the sampled tokens plus the rendered tool turn, even where
    re-tokenising the reply's text would give other tokens."""
    messages = template_messages([ChatMessage(role="user", content="6*7?")])
    prompt, parent = recording([]).chat_prompt(chat, messages, TOOLS)
    assert parent is None and prompt == chat.prompt_ids(messages, TOOLS)
    # Sampled: the call, split into odd tokens no tokenizer would produce, then <|im_end|>.
    sampled = [t for ch in CALL_TEXT for t in chat.encode(ch)] + [chat.turn_end_id]
    reply = split_reply(CALL_TEXT, tools_offered=True)
    first = stored(
        0, prompt, sampled, messages=messages, tools=TOOLS, reply=reply.template_message()
    )
    # The agent sends back the reply as OpenAI returned it, and the tool's result.
    returned = ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)
    follow_up = template_messages(
        [
            ChatMessage(role="user", content="6*7?"),
            returned,
            ChatMessage(role="tool", content="42", tool_call_id=reply.tool_calls[0].id),
        ]
    )
    prompt2, parent2 = recording([first]).chat_prompt(chat, follow_up, TOOLS)
    assert parent2 == 0
    assert prompt2[: len(first.sequence)] == first.sequence
    assert chat.decode(prompt2) == chat.render(follow_up, TOOLS, add_generation_prompt=True)
    # A different history, or other tools, starts afresh.
    edited = [*follow_up[:1], {"role": "assistant", "content": "42"}, *follow_up[2:]]
    assert recording([first]).chat_prompt(chat, edited, TOOLS)[1] is None
    assert recording([first]).chat_prompt(chat, follow_up, None)[1] is None


def test_completions_continue_the_longest_matching_call() -> None:
    calls = [stored(0, [1, 2], [3]), stored(1, [1, 2, 3, 4], [5]), stored(2, [9], [9])]
    assert recording(calls).token_parent([1, 2, 3, 4, 5, 6]) == 1
    assert recording(calls).token_parent([1, 2, 3, 7]) == 0
    assert recording(calls).token_parent([1, 2]) is None


# --- tool calls on the OpenAI wire -------------------------------------------------------


def test_replies_with_tool_calls_are_split_as_openai_returns_them() -> None:
    reply = split_reply("Let me compute.\n" + CALL_TEXT, tools_offered=True)
    assert reply.content == "Let me compute."
    (call,) = reply.tool_calls
    assert call.id.startswith("call_") and call.function.name == "python"
    assert json.loads(call.function.arguments) == {"code": "print(6*7)"}
    # No tools offered, or a call that does not parse: what the model wrote, as content.
    assert split_reply(CALL_TEXT, tools_offered=False).content == CALL_TEXT
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert split_reply(broken, tools_offered=True).content == broken
    assert split_reply("42", tools_offered=True).tool_calls == []


def test_streamed_replies_hold_back_tool_markup() -> None:
    stream = ReplyStream(tools_offered=True)
    pieces = [
        "Let me",
        " compute.\n<tool",
        '_call>\n{"name": "python", ',
        '"arguments": {}}\n</tool_call>',
    ]
    sent = [stream.push(piece) for piece in pieces]
    assert "".join(sent) == "Let me compute.\n" and sent[1] == " compute.\n"
    rest, calls = stream.finish()
    assert rest == "" and [(c.index, c.function.name) for c in calls] == [(0, "python")]
    plain = ReplyStream(tools_offered=True)
    assert plain.push("a <tool") == "a " and plain.push(" box") == "<tool box"
    assert plain.finish() == ("", [])


def test_tool_requests_are_checked() -> None:
    bad = ChatMessage.model_validate(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "python", "arguments": "{oops"},
                }
            ],
        }
    )
    with pytest.raises(InvalidInput, match="not valid JSON"):
        template_messages([ChatMessage(role="user", content="hi"), bad])
    with pytest.raises(ValueError, match="tool_call_id"):
        ChatMessage(role="tool", content="42")
    with pytest.raises(ValueError, match="cannot force a tool call"):
        ChatCompletionRequest(
            model="base",
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice="required",
        )

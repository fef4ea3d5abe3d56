"""The python-tool demo's pure parts: its tasks, demonstrations and evaluation summary."""

from __future__ import annotations

import itertools
import random

from agents.examples.python_tool_grpo import (
    COPY_ALPHABET,
    Evaluation,
    copy_texts,
    demonstration,
    make_splits,
    multiplication,
    rollout_task,
    summarize,
    training_tasks,
)
from services.rollout.schemas import Trajectory, TurnInfo
from services.rollout.tool_calls import format_tool_call, parse_tool_calls


def test_splits_are_disjoint_deterministic_and_cover_every_pair() -> None:
    splits = make_splits(held_out=50, validation=30, seed=3)
    assert (len(splits.held_out), len(splits.validation)) == (50, 30)
    questions = [{t.question for t in split} for split in splits]
    assert sum(len(q) for q in questions) == 90 * 90  # every two-digit pair, once
    assert not (
        questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2]
    )
    assert make_splits(50, 30, seed=3) == splits
    assert make_splits(50, 30, seed=4).held_out != splits.held_out


def test_the_demonstration_is_a_correct_tool_episode() -> None:
    task = multiplication(47, 86)
    assert (task.question, task.answer) == ("What is 47*86?", "4042")
    user, call, tool, answer = demonstration(task)
    assert user == {"role": "user", "content": "What is 47*86?"}
    (parsed,) = parse_tool_calls(call["content"])
    assert parsed.name == "python" and parsed.arguments == {"code": "print(47*86)"}
    # The tool turn is what the sandbox returns for the code: its stdout.
    assert tool == {"role": "tool", "content": "4042\n"}
    assert answer == {"role": "assistant", "content": "4042"}
    assert rollout_task(task) == {"prompt": "What is 47*86?", "reference": "4042"}


def trajectory(first_turn: str, reward: float | None) -> Trajectory:
    return Trajectory(
        task_index=0,
        sample_index=0,
        prompt_token_ids=[1],
        token_ids=[2, 3],
        logprobs=[0, 0],
        loss_mask=[1, 0],
        stop_reason="done",
        response="",
        reward=reward,
        turns=[
            TurnInfo(kind="model", start=0, end=1, text=first_turn, version=1),
            TurnInfo(kind="env", start=1, end=2, text="4042\n"),
        ],
    )


def test_summary_counts_successes_and_well_formed_python_calls() -> None:
    call = format_tool_call("python", {"code": "print(47*86)"})
    trajectories = [
        trajectory(call, 1.0),
        trajectory(call, 0.0),  # called the tool, answered wrong
        trajectory(format_tool_call("bash", {"code": "ls"}), 0.0),  # another tool
        trajectory("<tool_call>\n{not json}\n</tool_call>", 0.0),  # malformed
        trajectory("4042", None),  # no call; unscored counts as a failure
    ]
    assert summarize(trajectories) == Evaluation(success=0.2, tool_calls=0.4)


def test_training_tasks_cycle_through_the_split_reshuffled() -> None:
    train = [multiplication(a, 10) for a in range(10, 15)]
    stream = list(itertools.islice(training_tasks(train, random.Random(0)), 10))
    first, second = stream[:5], stream[5:]
    assert sorted(t["prompt"] for t in first) == sorted(t.question for t in train)
    assert sorted(t["prompt"] for t in second) == sorted(t.question for t in train)


def test_copy_texts_are_short_strings_of_the_copied_characters() -> None:
    texts = copy_texts(500, random.Random(0))
    assert len(texts) == 500 and len(set(texts)) > 490  # nearly all distinct
    assert all(3 <= len(t) <= 10 and set(t) <= set(COPY_ALPHABET) for t in texts)
    assert copy_texts(500, random.Random(0)) == texts

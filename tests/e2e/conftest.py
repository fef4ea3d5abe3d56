"""The whole stack as real local processes (`loom up`'s supervisor) on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.envs.python_tool import PYTHON_TOOL
from agents.sdk import AdamParams, Datum, LoomClient
from cli.supervisor import Supervisor
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings
from services.rollout.tool_calls import format_tool_call


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(gateway url, admin key, data dir) of a running stack, shared by the e2e modules."""
    data_dir = tmp_path_factory.mktemp("loom-stack")
    urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
    settings = LoomSettings(data_dir=data_dir, **urls)
    # Shards of 1 MiB: the tiny model's full weights reach rollout in several files, as a
    # real model's do.
    with Supervisor(settings, extra_env={"LOOM_TRAINER_SHARD_MB": "1"}) as supervisor:
        supervisor.start()
        key = (data_dir / "admin_key").read_text().strip()
        yield settings.gateway_url, key, data_dir


@dataclass(frozen=True)
class ToolModel:
    """A job whose latest version was taught one tool-use conversation (`conversation`, whose
    tokens are `token_ids`): asked `question`, it calls python with `code`, then answers."""

    job_id: str
    version: int
    question: str
    code: str
    answer: str
    conversation: list[dict[str, str]]
    token_ids: list[int]
    loss_mask: list[int]


@pytest.fixture(scope="package")
def tool_model(stack: tuple[str, str, Path]) -> ToolModel:
    url, key, _ = stack
    question, code, answer = "What is 123*45?", "print(123*45)", "5535"
    conversation = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": format_tool_call("python", {"code": code})},
        {"role": "tool", "content": f"{answer}\n"},
        {"role": "assistant", "content": answer},
    ]
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="tool-use", mode="full")
        rendered = loom.render(conversation, tools=[PYTHON_TOOL])
        datum = Datum(input_ids=rendered.token_ids, loss_mask=rendered.loss_mask)
        for _ in range(150):
            job.forward_backward([datum])
            job.optim_step(AdamParams(lr=3e-3))
        version = job.save_weights().result().number
    return ToolModel(
        job.id,
        version,
        question,
        code,
        answer,
        conversation,
        rendered.token_ids,
        rendered.loss_mask,
    )

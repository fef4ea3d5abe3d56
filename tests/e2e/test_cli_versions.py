"""`loom versions` on the real local stack: what a platform engineer sees of a job's versions
from the command line, and the store's refusals passed through as messages with exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from agents.algorithms import sft_datum
from agents.sdk import AdamParams, LoomClient
from cli.main import app
from modelstate.client import matches_manifest
from services.common.ports import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def published(stack) -> str:
    """A LoRA job with two versions: 1 (aliased `best`, with a metric) and 2."""
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.create_job("loom/tiny", name="cli-versions", mode="lora")
        prompt, answer = loom.tokenize(["31+2=", "33<|endoftext|>"])
        for step in range(2):
            job.forward_backward([sft_datum(prompt, answer)])
            job.optim_step(AdamParams(lr=1e-2))
            first = step == 0
            job.save_weights(
                aliases=["best"] if first else [], metrics={"reward": 0.5} if first else {}
            ).result()
    return job.id


def loom_cli(stack, *args: str) -> Result:
    url, key, _ = stack
    # Wide enough that tables keep each cell on one line.
    return CliRunner().invoke(app, [*args, "--url", url, "--api-key", key], env={"COLUMNS": "250"})


def test_list_show_and_compare(stack, published: str) -> None:
    listed = loom_cli(stack, "versions", "list", published, "--json")
    assert listed.exit_code == 0, listed.output
    versions = json.loads(listed.output)
    assert [v["number"] for v in versions] == [1, 2]
    assert versions[0]["metrics"] == {"reward": 0.5} and "best" in versions[0]["aliases"]

    table = loom_cli(stack, "versions", "list", published)
    assert table.exit_code == 0, table.output
    assert "reward=0.5" in table.output and "best" in table.output

    lineage = loom_cli(stack, "versions", "show", published, "--json")
    assert lineage.exit_code == 0, lineage.output
    chain = json.loads(lineage.output)
    assert [v["number"] for v in chain["versions"]] == [2, 1] and chain["complete"]
    shown = loom_cli(stack, "versions", "show", published, "best")
    assert shown.exit_code == 0, shown.output
    assert "adapter_model.safetensors" in shown.output and "loom/tiny" in shown.output

    diff = loom_cli(stack, "versions", "compare", published, "1")
    assert diff.exit_code == 0, diff.output
    changed = [line for line in diff.output.splitlines() if line.startswith("│ changed")]
    assert len(changed) == 1 and "adapter_model.safetensors" in changed[0]
    assert "stored once for both" in diff.output
    same = loom_cli(stack, "versions", "compare", published, "2", "latest")
    assert "hold the same files" in same.output


def test_alias_retention_and_a_refused_delete(stack, published: str) -> None:
    moved = loom_cli(stack, "versions", "alias", published, "best", "2")
    assert moved.exit_code == 0, moved.output
    assert "best → version 2" in moved.output
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        assert loom.get_job(published).version("best").number == 2

    refused = loom_cli(stack, "versions", "delete", published, "2")
    assert refused.exit_code == 1
    assert "has aliases ['best', 'latest']: move or delete them first" in refused.output

    before = loom_cli(stack, "versions", "retention", published)
    assert before.exit_code == 0, before.output
    assert "(the store's default)" in before.output
    kept = loom_cli(
        stack, "versions", "retention", published, "--keep-last", "1", "--keep-ancestors"
    )
    assert kept.exit_code == 0, kept.output
    assert "keeps the newest 1 version and the ancestors of aliased versions;" in kept.output
    shown = loom_cli(stack, "versions", "retention", published)
    assert "keeps the newest 1 version and the ancestors of aliased versions;" in shown.output
    negative = loom_cli(stack, "versions", "retention", published, "--keep-last", "-1")
    assert negative.exit_code == 2 and "--keep-last" in negative.output


def test_download_writes_the_version_as_stored(stack, published: str, tmp_path: Path) -> None:
    # `best` is kept whatever the retention test set (aliased versions always are).
    result = loom_cli(
        stack, "versions", "download", published, str(tmp_path / "best"), "--ref", "best"
    )
    assert result.exit_code == 0, result.output
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        version = loom.get_job(published).version("best")
    assert matches_manifest(tmp_path / "best", version)
    assert "adapter_model.safetensors" in result.output


def test_unknown_job_ref_and_missing_gateway_exit_1_with_the_reason(stack, published: str) -> None:
    unknown = loom_cli(stack, "versions", "list", "job_does_not_exist")
    assert unknown.exit_code == 1 and "job_does_not_exist" in unknown.output
    no_version = loom_cli(stack, "versions", "show", published, "9")
    assert no_version.exit_code == 1 and "no version 9" in no_version.output

    nowhere = CliRunner().invoke(
        app,
        [
            "versions",
            "list",
            published,
            "--url",
            f"http://127.0.0.1:{free_port()}",
            "--api-key",
            "k",
        ],
    )
    assert nowhere.exit_code == 1 and "No gateway answers" in nowhere.output

"""Unmodified Tinker SDK scripts (the real `tinker` package from PyPI, in a virtualenv of its
own, as a user would have it) against a running Loom: the gateway serves Tinker's protocol
on Loom's own trainer, rollout and modelstate."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest

from agents.sdk import LoomClient
from tests.support.sdk_venv import run_script, sdk_python

pytestmark = pytest.mark.e2e
TINKER = "tinker==0.38.0"
SCRIPTS = Path(__file__).resolve().parent / "tinker_scripts"


@pytest.fixture(scope="module")
def tinker_python() -> Path:
    # torch: forward_backward_custom differentiates the custom loss on the client.
    return sdk_python("tinker-sdk", [TINKER, f"torch=={importlib.metadata.version('torch')}"])


def sdk_env(stack: tuple[str, str, Path]) -> dict[str, str]:
    url, key, _ = stack
    return {
        "TINKER_BASE_URL": url,
        "TINKER_API_KEY": f"tml-{key}",
        "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1",
    }


def run(python: Path, name: str, stack: tuple[str, str, Path]) -> list[dict[str, Any]]:
    return run_script(python, SCRIPTS / name, sdk_env(stack))


def tinker_cli(python: Path, stack: tuple[str, str, Path], *args: str) -> Any:
    """The `tinker` CLI of the SDK's virtualenv, its JSON output read back."""
    done = subprocess.run(
        [str(python.parent / "tinker"), "-f", "json", *args],
        env={**os.environ, **sdk_env(stack)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_supervised_loop_lowers_the_loss_and_the_sampler_serves_the_new_weights(
    tinker_python: Path, stack: tuple[str, str, Path]
) -> None:
    *steps, final = run(tinker_python, "supervised.py", stack)
    losses = [step["loss"] for step in steps]
    assert len(losses) == 25 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.85 * losses[0], losses
    # loss:sum is the weighted sum of -logprob over the target tokens the script returned
    last = steps[-1]
    assert len(last["logprobs"]) == 7
    assert last["loss"] == pytest.approx(-sum(last["logprobs"][2:]), rel=0.05, abs=0.05)
    # Greedy samples of the new sampler, both alike, scored by the new sampler and by the
    # trained model alike: the sampler serves the trained weights.
    assert final["after"][0] == final["after"][1] and final["stop"] == ["length", "length"]
    assert final["trainer_logprobs"] == pytest.approx(final["sampler_logprobs"], abs=2e-3)
    # compute_logprobs on the sampler: None for the first token, then the trainer's; with
    # prompt_logprobs_last_n=3 only the last three are scored.
    scored, tail = final["scored"], final["scored_tail"]
    assert scored[0] is None and scored[1:] == pytest.approx(final["trainer_all"], abs=2e-3)
    assert tail[:-3] == [None] * (len(scored) - 3)
    assert tail[-3:] == pytest.approx(scored[-3:], abs=1e-5)


def test_rl_loop_trains_on_its_samples_and_samples_each_new_version(
    tinker_python: Path, stack: tuple[str, str, Path]
) -> None:
    *iterations, final = run(tinker_python, "rl.py", stack)
    assert len(iterations) == 4
    first = iterations[0]
    # The trainer's logprobs of the sampled tokens, before any step, are the sampler's: the
    # tokens line up and both run the same weights.
    for sampled, trained in zip(first["sampler_logprobs"], first["trainer_logprobs"], strict=True):
        assert trained == pytest.approx(sampled, abs=2e-3)
    assert all(math.isfinite(i["loss"]) for i in iterations)
    url, key, _ = stack
    jobs = httpx2.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}).json()
    (job_id,) = [
        j["id"] for j in jobs["jobs"] if j["config"].get("tinker_model_id") == final["model_id"]
    ]
    with LoomClient(url, key) as loom:
        # the first sampler, then one version per iteration, each sampled by the next round
        assert loom.get_job(job_id).version("latest").number == 5


def test_tokenizer_top_k_logprobs_cispo_dro_and_custom_losses(
    tinker_python: Path, stack: tuple[str, str, Path]
) -> None:
    tokenizer, sampled, forwards, trained, custom = run(tinker_python, "losses.py", stack)
    # get_tokenizer loads the base model's directory on this host: nothing from a hub
    assert (Path(tokenizer["tokenizer"]) / "config.json").exists()
    assert tokenizer["round_trip"] == "12+34="
    # Greedy: each sampled token is its position's most likely one, with the same logprob;
    # every row holds k = 3 tokens, most likely first.
    for token, logprob, row in zip(
        sampled["tokens"], sampled["logprobs"], sampled["top"], strict=True
    ):
        assert len(row) == 3 and row[0][0] == token
        assert row[0][1] == pytest.approx(logprob, abs=1e-4)
        assert row[0][1] >= row[1][1] >= row[2][1]
    # The prompt: nothing for its first token; then the top 3, which bound the token's own.
    prompt_top, prompt_logprobs = sampled["prompt_top"], sampled["prompt_logprobs"]
    assert prompt_top[0] is None and prompt_logprobs[0] is None and len(prompt_top) == 4
    for row, own in zip(prompt_top[1:], prompt_logprobs[1:], strict=True):
        assert len(row) == 3 and row[0][1] >= own - 1e-4
    # cispo and dro report the values of their formulas at the trainer's logprobs
    old, advantages = forwards["old"], forwards["advantages"]

    def cispo(low: float, high: float, logprobs: list[float]) -> float:
        return -sum(
            min(max(math.exp(lp - o), low), high) * lp * a
            for lp, o, a in zip(logprobs, old, advantages, strict=True)
        )

    def dro(beta: float, logprobs: list[float]) -> float:
        return -sum(
            lp * a - 0.5 * beta * (lp - o) ** 2
            for lp, o, a in zip(logprobs, old, advantages, strict=True)
        )

    tolerance = {"rel": 1e-4, "abs": 1e-4}
    at = {name: forwards[name]["logprobs"] for name in ("cispo", "cispo_clipped", "dro")}
    assert forwards["cispo"]["loss"] == pytest.approx(cispo(0.0, 4.0, at["cispo"]), **tolerance)
    assert forwards["cispo_clipped"]["loss"] == pytest.approx(
        cispo(0.5, 1.5, at["cispo_clipped"]), **tolerance
    )
    assert forwards["cispo"]["loss"] != pytest.approx(forwards["cispo_clipped"]["loss"])
    assert forwards["dro"]["loss"] == pytest.approx(dro(0.1, at["dro"]), **tolerance)
    # forward_backward computes the same loss (dro at the SDK's default beta, 0.05) and trains
    assert trained["trained"]["cispo"] == pytest.approx(forwards["cispo"]["loss"], **tolerance)
    assert trained["trained"]["dro"] == pytest.approx(dro(0.05, at["dro"]), **tolerance)
    # The custom loss falls; its reported value is the client's own, from the logprobs the
    # trainer gave it.
    losses = custom["custom_losses"]
    assert len(losses) == 12 and losses[-1] < 0.7 * losses[0], losses
    assert custom["custom_final"] < losses[-1]


def test_saved_state_loads_back_with_and_without_the_optimizer_and_seeds_new_clients(
    tinker_python: Path, stack: tuple[str, str, Path]
) -> None:
    (seen,) = run(tinker_python, "checkpoints.py", stack)
    model_id, path = seen["model_id"], seen["path"]
    assert path == f"tinker://{model_id}/weights/after-3"
    same = {"abs": 1e-5}
    assert seen["moved"] != pytest.approx(seen["at_save"], abs=1e-3)  # training went on
    # The weights went back, and with the optimizer's moments the next step is the one
    # taken from the saved state the first time; without them it is another step.
    assert seen["loaded_with_optimizer"] == pytest.approx(seen["at_save"], **same)
    assert seen["stepped_with_optimizer"] == pytest.approx(seen["one_step_on"], **same)
    assert seen["loaded_weights_only"] == pytest.approx(seen["at_save"], **same)
    assert seen["stepped_weights_only"] != pytest.approx(seen["one_step_on"], **same)
    # New training clients from the state: a job of their own, the same way.
    assert seen["resumed_model_id"] != model_id and seen["resumed_rank"] == 8
    assert seen["resumed_at_load"] == pytest.approx(seen["at_save"], **same)
    assert seen["resumed_stepped"] == pytest.approx(seen["one_step_on"], **same)
    assert seen["fresh_stepped"] == pytest.approx(seen["stepped_weights_only"], **same)
    assert "never reused" in seen["reused"]
    assert seen["listed"] == [
        ["weights/after-3", "training", path],
        ["sampler_weights/final", "sampler", seen["sampler_path"]],
    ]
    assert seen["info"] == {"base_model": "loom/tiny", "lora_rank": 8}
    assert seen["after_delete"] == ["weights/after-3", "sampler_weights/final"]
    url, key, _ = stack
    jobs = httpx2.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}).json()
    loaded_from = [j["config"].get("tinker_loaded_from") for j in jobs["jobs"]]
    assert loaded_from.count(path) == 2


def test_bad_tinker_requests_get_clear_client_errors(stack: tuple[str, str, Path]) -> None:
    url, key, _ = stack
    api = f"{url}/api/v1"
    auth = {"X-API-Key": f"tml-{key}"}
    assert httpx2.post(f"{api}/create_session", json={}).status_code == 401
    assert (
        httpx2.post(
            f"{api}/create_session", json={}, headers={"X-API-Key": "tml-not-a-key"}
        ).status_code
        == 401
    )
    session = httpx2.post(f"{api}/create_session", json={}, headers=auth).json()["session_id"]
    created = httpx2.post(
        f"{api}/create_model",
        headers=auth,
        json={"session_id": session, "model_seq_id": 0, "base_model": "loom/tiny"},
    ).json()
    retrieved = httpx2.post(
        f"{api}/retrieve_future",
        headers=auth,
        timeout=60,
        json={"request_id": created["request_id"]},
    ).json()
    assert retrieved["model_id"] == created["model_id"]
    cases = [
        ("forward_backward", {"content": b"\xff\x00 not protobuf"}, 422, "ForwardBackward"),
        ("forward_backward", {"content": b"\0" * (65 << 20)}, 413, "MiB"),
        (
            "optim_step",
            {
                "json": {
                    "model_id": created["model_id"],
                    "seq_id": 1,
                    "adam_params": {"learning_rate": 5.0},
                }
            },
            422,
            "lr",
        ),
        ("optim_step", {"json": {"model_id": "nope:train:0", "seq_id": 1}}, 404, "nope"),
        ("create_model", {"json": {"session_id": session}}, 422, "model_seq_id"),
        (
            "asample",
            {"json": {"sampling_session_id": "nope:sample:0", "prompt": {"chunks": []}}},
            404,
            "nope",
        ),
        ("retrieve_future", {"json": {"request_id": "req-unknown"}}, 404, "req-unknown"),
    ]
    for call, body, status, words in cases:
        response = httpx2.post(f"{api}/{call}", headers=auth, timeout=60, **body)
        assert response.status_code == status, (call, response.text[:300])
        assert words in response.json()["error"]["message"], (call, response.text[:300])


def test_a_refused_call_leaves_the_clients_next_calls_free(
    tinker_python: Path, stack: tuple[str, str, Path]
) -> None:
    """Before, the refused call's seq_id was never used, and every later call on the model
    failed after waiting 60 s for it: here they succeed (an lr=0 warm-up step included)."""
    (seen,) = run(tinker_python, "refused.py", stack)
    assert seen["refused"] is not None and "no_such_option" in seen["refused"], seen
    assert "grad_norm:mean" in seen["warm_up_lr0"]


def test_rest_calls_ttls_base_model_checks_and_the_tinker_cli(
    tinker_python: Path, stack: tuple[str, str, Path]
) -> None:
    (seen,) = run(tinker_python, "rest.py", stack)
    model_id, kept, short, sampler = (seen[k] for k in ("model_id", "kept", "short", "sampler"))
    assert ["loom/tiny", True, True] in seen["models"]
    for refused in ("unserved_training", "unserved_sampling"):
        assert "'Qwen/Qwen3-8B'" in (seen[refused] or "") and "loom/tiny" in seen[refused], (
            refused,
            seen,
        )
    assert seen["run"] == {
        "id": model_id,
        "base_model": "loom/tiny",
        "is_lora": True,
        "lora_rank": 4,
        "corrupted": False,
        "last_sampler": sampler,
    }
    assert seen["run_by_path"] == model_id
    assert model_id in seen["runs"]["ids"] and seen["runs"]["total"] >= 1
    # every checkpoint with a TTL says when it expires
    assert seen["listed"] == {kept: True, short: True, sampler: True}
    assert {kept, short, sampler} <= set(seen["user_checkpoints"])
    assert seen["session"] == {"runs": [model_id], "samplers": []}
    assert model_id.split(":")[0] in seen["sessions"]
    assert "publish" in seen["unserved_rest"] and "does not serve" in seen["unserved_rest"]
    # `short` (2 s) expired: no longer listed nor loadable; the client's next call still ran
    assert short not in seen["after_expiry"] and kept in seen["after_expiry"]
    assert "No checkpoint 'short'" in seen["load_expired"] and seen["next_call_ran"]

    cli = functools.partial(tinker_cli, tinker_python, stack)
    assert {
        "model_name": "loom/tiny",
        "max_context_length": None,
        "trainable": True,
        "sampleable": True,
    } in cli("model", "list")["models"]
    assert model_id in [r["training_run_id"] for r in cli("run", "list")["runs"]]
    assert cli("run", "info", model_id)["lora_rank"] == 4
    by_run = cli("checkpoint", "list", "--run-id", model_id)["checkpoints"]
    assert {c["tinker_path"] for c in by_run} == {kept, sampler}
    assert {kept, sampler} <= {c["tinker_path"] for c in cli("checkpoint", "list")["checkpoints"]}
    assert cli("checkpoint", "info", kept)["checkpoint_id"] == "weights/kept"
    cli("checkpoint", "set-ttl", kept, "--remove")
    (info,) = [
        c
        for c in cli("checkpoint", "list", "--run-id", model_id)["checkpoints"]
        if c["tinker_path"] == kept
    ]
    assert info["expires_at"] is None
    assert cli("checkpoint", "delete", kept, "-y") == {"deleted_count": 1, "failed": []}
    after = cli("checkpoint", "list", "--run-id", model_id)["checkpoints"]
    assert [c["tinker_path"] for c in after] == [sampler]

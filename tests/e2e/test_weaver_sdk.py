"""Unmodified Weaver SDK scripts (the real `nex-weaver` package from PyPI, in a virtualenv of
its own, as a user would have it) against a running Loom: the gateway serves Weaver's REST
protocol under /weaver on Loom's own trainer, rollout and modelstate."""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path
from typing import Any

import httpx2
import pytest

from agents.sdk import LoomClient
from tests.support.sdk_venv import run_script, sdk_python

pytestmark = pytest.mark.e2e
WEAVER = "nex-weaver==1.19.2"
SCRIPTS = Path(__file__).resolve().parent / "weaver_scripts"


@pytest.fixture(scope="module")
def weaver_python() -> Path:
    # The SDK needs torch: the build Loom runs on, not a second multi-GB download.
    return sdk_python("weaver-sdk", [WEAVER, f"torch=={importlib.metadata.version('torch')}"])


def run(python: Path, name: str, stack: tuple[str, str, Path]) -> list[dict[str, Any]]:
    url, key, _ = stack
    return run_script(
        python,
        SCRIPTS / name,
        {
            "WEAVER_BASE_URL": f"{url}/weaver",
            "WEAVER_API_KEY": key,
            "HF_HUB_OFFLINE": "1",
            "WEAVER_OPERATION_POLL_INTERVAL": "0.05",
        },
    )


def test_supervised_loop_lowers_the_loss_and_the_sampler_serves_the_new_weights(
    weaver_python: Path, stack: tuple[str, str, Path]
) -> None:
    *steps, final = run(weaver_python, "supervised.py", stack)
    losses = [step["loss"] for step in steps]
    assert len(losses) == 25 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.85 * losses[0], losses
    assert all(step["grad_norm"] > 0 for step in steps)
    # loss:sum is the sum of -logprob over the scored targets; -100 targets score 0.0
    last = steps[-1]
    assert len(last["logprobs"]) == 7 and last["logprobs"][:2] == [0.0, 0.0]
    assert all(step["wrapped"] == step["logprobs"] for step in steps)
    assert last["loss"] == pytest.approx(-sum(last["logprobs"]), rel=0.05, abs=0.05)
    # Greedy samples of the new sampler, both alike, scored by the new sampler and by the
    # trained model alike: the sampler serves the trained weights.
    assert final["after"][0] == final["after"][1] and final["stop"] == ["length", "length"]
    assert isinstance(final["text"], str)
    trainer = final["trainer_all"]
    assert trainer[2:] == pytest.approx(final["sampler_logprobs"], abs=2e-3)
    # compute_logprobs scores the whole sequence on the sampler: None, then the trainer's
    assert final["sampler_scored"][0] is None
    assert final["sampler_scored"][1:] == pytest.approx(trainer, abs=2e-3)
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.get_job(final["model_id"])  # a Weaver model is a Loom job
        assert job.info.status.value == "completed"  # the SDK terminated it at close
        assert job.info.config["weaver_base_model"] == "loom/tiny"
        logged = job.metrics(["train/loss"])["train/loss"]  # log_metrics: the job's metrics
        assert logged.steps == list(range(25)) and logged.values == pytest.approx(losses)


def test_rl_loop_trains_on_its_samples_and_samples_each_new_version(
    weaver_python: Path, stack: tuple[str, str, Path]
) -> None:
    *iterations, final = run(weaver_python, "rl.py", stack)
    assert len(iterations) == 4
    # The first sampler is version 1 (the untrained adapter), then one version per iteration.
    assert [i["versions"] for i in iterations] == [[1], [2], [3], [4]]
    first = iterations[0]
    # The trainer's logprobs of the sampled tokens, before any step, are the sampler's: the
    # tokens line up and both run the same weights.
    for sampled, trained in zip(first["sampler_logprobs"], first["trainer_logprobs"], strict=True):
        assert trained == pytest.approx(sampled, abs=2e-3)
    assert all(math.isfinite(i["loss"]) for i in iterations)
    model_id = final["model_id"]
    assert final["path"] == f"weaver://{model_id}/sampler_weights/iteration-3"
    assert final["info"]["training_mode"] == "lora" and final["info"]["id"] == model_id
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        assert loom.get_job(model_id).version("latest").number == 5


def test_full_fine_tuning_trains_every_weight_and_the_sampler_serves_them(
    weaver_python: Path, stack: tuple[str, str, Path]
) -> None:
    (seen,) = run(weaver_python, "full_ft.py", stack)
    losses = seen["losses"]
    assert losses[-1] < 0.85 * losses[0], losses
    info = seen["info"]
    assert info["training_mode"] == "full_ft" and info["base_model"] == "loom/tiny:2048"
    assert info["lora_config"] is None
    assert seen["trainer_logprobs"] == pytest.approx(seen["sampler_logprobs"], abs=2e-3)
    url, key, _ = stack
    with LoomClient(url, key) as loom:
        job = loom.get_job(info["id"])
        assert job.info.mode.value == "full" and job.info.base_model == "loom/tiny"
        assert job.version("latest").kind == "full"


def test_custom_losses_cispo_dro_and_top_k_prompt_logprobs(
    weaver_python: Path, stack: tuple[str, str, Path]
) -> None:
    custom, prompt, policy = run(weaver_python, "custom.py", stack)
    # forward_backward_custom: the client's loss falls as the surrogate carries its gradient
    losses = custom["custom_losses"]
    assert len(losses) == 12 and losses[-1] < 0.7 * losses[0], losses
    assert custom["custom_final"] < losses[-1]
    # top-k prompt logprobs: nothing for the first token, then the 3 most likely, which
    # bound the token's own logprob
    top, own = prompt["prompt_top"], prompt["prompt_logprobs"]
    assert top[0] is None and own[0] is None and len(top) == len(own) == 4
    for row, logprob in zip(top[1:], own[1:], strict=True):
        assert len(row) == 3 and row[0][1] >= row[1][1] >= row[2][1] >= -1e9
        assert row[0][1] >= logprob - 1e-4
    # cispo and dro on samples of the weights being trained: every ratio is 1 (no clip, no
    # penalty), so both are the policy gradient's -sum(logprob * A), A = 1
    expected = -sum(policy["logprobs"])
    assert policy["cispo"] == pytest.approx(expected, abs=1e-2)
    assert policy["dro"] == pytest.approx(expected, abs=1e-2)


def test_saved_state_loads_back_with_and_without_the_optimizer_and_into_another_model(
    weaver_python: Path, stack: tuple[str, str, Path]
) -> None:
    (seen,) = run(weaver_python, "checkpoints.py", stack)
    path = seen["path"]
    assert path == f"weaver://{seen['model_id']}/checkpoints/after-3"
    assert seen["type"] == "weight"
    same = {"abs": 1e-5}
    assert seen["moved"] != pytest.approx(seen["at_save"], abs=1e-3)  # training went on
    # The weights went back, and with the optimizer's moments the next step is the one
    # taken from the saved state the first time; without them it is another step.
    assert seen["loaded_with_optimizer"] == pytest.approx(seen["at_save"], **same)
    assert seen["stepped_with_optimizer"] == pytest.approx(seen["one_step_on"], **same)
    assert seen["loaded_weights_only"] == pytest.approx(seen["at_save"], **same)
    assert seen["stepped_weights_only"] != pytest.approx(seen["one_step_on"], **same)
    assert seen["listed"] == [["after-3", path]]
    # Another model (a job of its own) loads the checkpoint and goes on the same way.
    assert seen["other_id"] != seen["model_id"]
    assert seen["other_at_load"] == pytest.approx(seen["at_save"], **same)
    assert seen["other_stepped"] == pytest.approx(seen["one_step_on"], **same)


def test_bad_weaver_requests_get_clear_errors_in_the_sdks_shape(
    stack: tuple[str, str, Path],
) -> None:
    url, key, _ = stack
    api = f"{url}/weaver/api/v1"
    auth = {"X-WEAVER-API-KEY": key}
    missing = httpx2.post(f"{api}/sessions", json={})
    assert missing.status_code == 401 and missing.json()["error"] == "unauthorized"
    assert (
        httpx2.post(
            f"{api}/sessions", json={}, headers={"X-WEAVER-API-KEY": "sk-not-a-key"}
        ).status_code
        == 401
    )
    session = httpx2.post(f"{api}/sessions", json={}, headers=auth).json()["id"]
    model = httpx2.post(
        f"{api}/sessions/{session}/models",
        headers=auth,
        timeout=60,
        json={"model_seq_id": 1, "base_model": "loom/tiny", "lora_config": {"rank": 4}},
    ).json()["id"]
    datum = {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]},
        "loss_fn_inputs": {"target_tokens": {"data": [6, 7, 8], "dtype": "int64"}},
    }

    def passes(**fields: Any) -> dict[str, Any]:
        payload = {
            "model_id": model,
            "seq_id": 1,
            "forward_backward_input": {"loss_fn": "cross_entropy", "data": [datum]},
        } | fields
        return {"json": {"payload": payload}}

    wrong_targets = {**datum, "loss_fn_inputs": {"target_tokens": [9, 9, 9]}}
    cases = [
        (
            "post",
            f"models/{model}/forward-backward-passes",
            passes(forward_backward_input={"loss_fn": "dpo", "data": [datum]}),
            422,
            "'dpo' is not served",
        ),
        (
            "post",
            f"models/{model}/forward-backward-passes",
            passes(forward_backward_input={"loss_fn": "cross_entropy", "data": [wrong_targets]}),
            422,
            "shifted by one",
        ),
        (
            "post",
            f"models/{model}/forward-backward-passes",
            passes(model_id="other"),
            422,
            "payload.model_id",
        ),
        (
            "post",
            "models/job-nope/optimizer-steps",
            {"json": {"payload": {"model_id": "job-nope", "seq_id": 1}}},
            404,
            "job-nope",
        ),
        (
            "post",
            f"models/{model}/optimizer-steps",
            {
                "json": {
                    "payload": {
                        "model_id": model,
                        "seq_id": 1,
                        "adam_params": {"learning_rate": 5.0},
                    }
                }
            },
            422,
            "lr",
        ),
        (
            "post",
            f"sessions/{session}/models",
            {"json": {"base_model": "loom/tiny"}},
            422,
            "model_seq_id",
        ),
        ("post", f"models/{model}/load", {"json": {"path": "s3://elsewhere"}}, 422, "weaver://"),
        (
            "post",
            "sampling-sessions/nope/samples",
            {"json": {"prompt": {"chunks": []}}},
            404,
            "nope",
        ),
        (
            "post",
            "sampling-sessions/nope/logprobs",
            {"json": {"prompt": {"chunks": []}}},
            404,
            "nope",
        ),
        ("post", f"models/{model}/deployments", {"json": {}}, 404, "does not serve"),
        ("get", "operations/op-unknown", {}, 404, "op-unknown"),
        (
            "post",
            f"models/{model}/forward-backward-passes",
            {"content": b"\0" * (65 << 20)},
            413,
            "MiB",
        ),
        (
            "post",
            f"models/{model}/forward-backward-passes",
            {"content": b"--x\r\n", "headers": {**auth, "Content-Type": "multipart/mixed"}},
            422,
            "http-binary",
        ),
    ]
    for method, path, body, status, words in cases:
        body = {"headers": auth, **body}
        response = httpx2.request(method, f"{api}/{path}", timeout=60, **body)
        assert response.status_code == status, (path, response.text[:300])
        error = response.json()
        assert words in error["message"], (path, response.text[:300])
        assert error["retryable"] is False and isinstance(error["error"], str)
    # Nothing half-made: the model still takes its first call.
    fine = httpx2.post(
        f"{api}/models/{model}/forward-backward-passes", headers=auth, timeout=60, **passes()
    )
    assert fine.status_code == 200 and fine.json()["status"] in {"pending", "done"}
    done = httpx2.get(f"{api}/operations/{fine.json()['id']}", headers=auth, timeout=60).json()
    assert done["status"] == "done" and done["response"]["metrics"]["loss:sum"] > 0


def test_listing_calls_ttls_and_base_model_checks(
    weaver_python: Path, stack: tuple[str, str, Path]
) -> None:
    (seen,) = run(weaver_python, "listing.py", stack)
    model_id = seen["model_id"]
    assert "loom/tiny" in seen["names"]
    assert ["loom/tiny", ["lora", "full_ft"], "0"] in seen["detailed"]  # priced at 0
    for refused in ("unserved_training", "unserved_sampling"):
        assert "'Qwen/Qwen3-8B'" in (seen[refused] or "") and "loom/tiny" in seen[refused], (
            refused,
            seen,
        )
    assert seen["short"]["ttl"] in (1, 2) and seen["short"]["expires"]
    assert model_id in seen["models"]["ids"] and seen["models"]["total"] >= 1
    assert [model_id, "loom/tiny", "lora", {"rank": 4}] in seen["runs"]
    assert seen["run_checkpoints"] == sorted([seen["kept"], seen["short"]["path"]])
    assert "GET /api/v1/quota/balance" in seen["unserved_get"]
    assert seen["after_expiry"] == [seen["kept"]]  # `short` (2 s) expired

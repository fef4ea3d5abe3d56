"""The rollout service on a real vLLM engine (one for the whole module: start-up is ~50 s) and
a real modelstate (uvicorn in a thread). Modelstate is started only after rollout is up, so
the hand-off follower is also shown to survive a store that is down at start."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from modelstate.client import ModelStateClient
from modelstate.schemas import VersionKind, VersionMeta
from services.rollout.schemas import derive_seed
from services.rollout.settings import RolloutSettings
from tests.integration.rollout.conftest import PROMPT, TIMINGS
from tests.support.adapters import lora_adapter

pytestmark = pytest.mark.integration


async def sample(client: httpx2.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("prompt_token_ids", PROMPT)
    body.setdefault("params", {"max_tokens": 8, "seed": 1})
    response = await client.post("/v1/sample", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def perturbed_copy(model_dir: Path, dest: Path, scale: float) -> Path:
    """A full version: the tiny model's weights scaled (only safetensors, as a trainer ships)."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    tensors = load_file(model_dir / "model.safetensors")
    save_file(
        {k: (v * scale).contiguous() for k, v in tensors.items()},
        dest / "model.safetensors",
        metadata={"format": "pt"},
    )
    return dest


# --- sampling --------------------------------------------------------------------------------


async def test_sample_base_model(rollout: httpx2.AsyncClient) -> None:
    started = time.perf_counter()
    body = await sample(rollout, n=3)
    TIMINGS["first_sample_s"] = time.perf_counter() - started
    assert body["version"] == 0 and body["job_id"] is None
    assert body["prompt_token_ids"] == PROMPT
    assert len(body["samples"]) == 3
    for s in body["samples"]:
        assert len(s["token_ids"]) == len(s["logprobs"]) >= 1
        assert all(lp <= 0 for lp in s["logprobs"])
        assert s["stop_reason"] in ("stop", "length") and s["version"] == 0
    again = await sample(rollout, n=3)
    assert again["samples"] == body["samples"]  # seeded: reproducible


async def test_sample_texts_are_the_texts_vllm_detokenizes(rollout: httpx2.AsyncClient) -> None:
    """Samples are decoded once they are done, not detokenized by vLLM token by token. A stop
    string that never matches makes vLLM detokenize the same tokens: the texts must agree."""
    first = await sample(rollout, n=8, params={"max_tokens": 40, "seed": 7})
    stop_token = first["samples"][0]["token_ids"][10]  # one the model samples
    params = {"max_tokens": 40, "seed": 7, "stop_token_ids": [stop_token]}
    ours = await sample(rollout, n=8, params=params)
    vllms = await sample(rollout, n=8, params={**params, "stop": ["\u0000never"]})
    assert [s["token_ids"] for s in ours["samples"]] == [s["token_ids"] for s in vllms["samples"]]
    assert [s["text"] for s in ours["samples"]] == [s["text"] for s in vllms["samples"]]
    assert "stop" in {s["stop_reason"] for s in ours["samples"]}
    assert all(s["text"] for s in ours["samples"] if len(s["token_ids"]) > 1)


async def test_prompt_logprobs_score_a_sample_as_the_sampler_did(
    rollout: httpx2.AsyncClient,
) -> None:
    """A sample appended to its prompt and scored as a prompt gets back the logprobs it was
    sampled with: prompt logprobs and sampled logprobs come from the same weights."""
    drawn = (await sample(rollout, params={"max_tokens": 6, "temperature": 0.0}))["samples"][0]
    scored = await sample(
        rollout,
        prompt_token_ids=PROMPT + drawn["token_ids"],
        params={"max_tokens": 1},
        prompt_logprobs=True,
    )
    logprobs = scored["prompt_logprobs"]
    assert len(logprobs) == len(PROMPT) + len(drawn["token_ids"]) and logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs[1:])
    assert logprobs[len(PROMPT) :] == pytest.approx(drawn["logprobs"], abs=2e-3)
    assert (await sample(rollout))["prompt_logprobs"] is None  # only when asked


async def test_top_logprobs_rank_the_most_likely_tokens_of_samples_and_prompts(
    rollout: httpx2.AsyncClient,
) -> None:
    greedy = {"max_tokens": 6, "temperature": 0.0}
    body = await sample(rollout, params=greedy, top_logprobs=4, prompt_top_logprobs=2)
    (drawn,) = body["samples"]
    assert len(drawn["top_logprobs"]) == len(drawn["token_ids"])
    for token, logprob, row in zip(
        drawn["token_ids"], drawn["logprobs"], drawn["top_logprobs"], strict=True
    ):
        ranked = [lp for _, lp in row]
        assert len(row) == 4 and ranked == sorted(ranked, reverse=True)
        assert row[0][0] == token and row[0][1] == pytest.approx(logprob, abs=1e-5)  # greedy
    top, own = body["prompt_top_logprobs"], body["prompt_logprobs"]
    assert len(top) == len(own) == len(PROMPT) and top[0] is None and own[0] is None
    for (token, row), logprob in zip(zip(PROMPT[1:], top[1:], strict=True), own[1:], strict=True):
        assert len(row) == 2 and row[0][1] >= logprob - 1e-5
        if token in (t for t, _ in row):  # a prompt token among the top two: its own logprob
            assert dict(row)[token] == pytest.approx(logprob, abs=1e-5)
    plain = await sample(rollout, params=greedy)
    assert plain["samples"][0]["top_logprobs"] is None and plain["prompt_top_logprobs"] is None
    too_many = await rollout.post(
        "/v1/sample", json={"prompt_token_ids": PROMPT, "top_logprobs": 21}
    )
    assert too_many.status_code == 422 and "top_logprobs" in too_many.text


async def test_seeded_samples_survive_more_prompt_tokens_than_one_engine_step(
    rollout: httpx2.AsyncClient,
) -> None:
    """More queued prompt tokens than a step takes (2,048 on CPU): vLLM would split a prompt
    across steps and then fail to rewind the seeded CPU generator, killing the engine."""
    prompt = list(range(3, 203))  # 200 tokens; 32 requests: 6,400 prompt tokens at once
    results = await asyncio.gather(
        *(
            sample(rollout, prompt_token_ids=prompt, params={"max_tokens": 4, "seed": i})
            for i in range(32)
        )
    )
    assert all(len(r["samples"][0]["token_ids"]) >= 1 for r in results)
    assert (await rollout.get("/readyz")).status_code == 200


async def test_an_idle_cpu_worker_does_not_keep_busy_polling(rollout: httpx2.AsyncClient) -> None:
    """vLLM's worker would spin on its message queue for a second after every message, a
    core taken from the trainer on a small machine; ours stops after a few milliseconds
    (the plugin services.rollout.vllm_plugin)."""
    engine = rollout._transport.app.state.engine  # type: ignore[attr-defined]
    await sample(rollout, n=1)
    per_worker = await engine.llm.collective_rpc("loom_queue_busy_loop_s")
    assert per_worker and all(per_worker), per_worker  # every worker reads at least one queue
    expected = RolloutSettings().rollout_cpu_busy_poll_ms / 1000
    assert {s for spins in per_worker for s in spins} == {expected}


async def test_a_batch_samples_each_prompt_as_its_own_request_with_a_derived_seed(
    rollout: httpx2.AsyncClient,
) -> None:
    """One request, one engine batch: prompt i's samples are those of a request of its own
    seeded `derive_seed(seed, i)`, text prompts tokenized as /v1/sample does."""
    params = {"max_tokens": 6, "seed": 3}
    prompts: list[Any] = [PROMPT, "12+7=", PROMPT]
    response = await rollout.post(
        "/v1/sample/batch", json={"prompts": prompts, "n": 2, "params": params}
    )
    assert response.status_code == 200, response.text
    batch = response.json()
    assert batch["version"] == 0 and len(batch["responses"]) == 3
    for index, (prompt, got) in enumerate(zip(prompts, batch["responses"], strict=True)):
        text = isinstance(prompt, str)
        alone = await sample(
            rollout,
            n=2,
            params={**params, "seed": derive_seed(3, index)},
            prompt=prompt if text else None,
            prompt_token_ids=None if text else prompt,
        )
        assert got == alone
    assert batch["responses"][0]["samples"] != batch["responses"][2]["samples"]


async def test_sample_text_prompt_and_tokenize(rollout: httpx2.AsyncClient) -> None:
    tokens = (await rollout.post("/v1/tokenize", json={"texts": ["12+7=", "3"]})).json()
    ids = tokens["token_ids"]
    assert len(ids) == 2 and all(ids)
    body = await sample(rollout, prompt="12+7=", prompt_token_ids=None)
    assert body["prompt_token_ids"] == ids[0]
    assert body["samples"][0]["text"]  # detokenized


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/sample", {"prompt_token_ids": [1, 999]}, "[0, 271)"),
        (
            "/v1/sample",
            {"prompt_token_ids": [1] * 500, "params": {"max_tokens": 20}},
            "= 520 exceeds the model's context of 512",
        ),
        ("/v1/sample", {"prompt": "x", "prompt_token_ids": [1]}, "exactly one"),
        ("/v1/sample", {"prompt": "x", "temperature": 0}, "temperature"),
        ("/v1/sample", {"prompt": "x", "version": 2}, "needs a job_id"),
        ("/v1/sample/batch", {"prompts": [[1], [1, 999]]}, "Prompt 1: Prompt token ids"),
        ("/v1/sample/batch", {"prompts": []}, "prompts"),
        ("/v1/tokenize", {"texts": []}, "texts"),
        ("/v1/load", {"job_id": "bad job"}, "job_id"),
        ("/v1/completions", {"model": "base", "prompt": [1, 999]}, "[0, 271)"),
        ("/v1/completions", {"model": "base"}, "prompt"),
        (
            "/v1/chat/completions",
            {"model": "base", "messages": [{"role": "x", "content": "a"}]},
            "role",
        ),
    ],
)
async def test_malformed_requests_get_a_clear_4xx(
    rollout: httpx2.AsyncClient, path: str, body: dict[str, Any], fragment: str
) -> None:
    response = await rollout.post(path, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and fragment in error["message"], error


async def test_not_json_is_a_4xx(rollout: httpx2.AsyncClient) -> None:
    response = await rollout.post(
        "/v1/sample", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422


# --- OpenAI-compatible -------------------------------------------------------------------------


async def test_openai_completions(rollout: httpx2.AsyncClient) -> None:
    response = await rollout.post(
        "/v1/completions",
        json={"model": "base", "prompt": "1+1=", "max_tokens": 6, "n": 2, "logprobs": 2, "seed": 3},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        logprobs = choice["logprobs"]
        assert (
            len(logprobs["tokens"])
            == len(logprobs["token_logprobs"])
            == len(choice["loom"]["token_ids"])
        )
        assert all(isinstance(token, str) for token in logprobs["tokens"])
        assert all(len(top) <= 3 for top in logprobs["top_logprobs"])
        assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["loom"]["version"] == 0


async def read_sse(response: httpx2.Response) -> list[dict[str, Any]]:
    events = [
        line.removeprefix("data: ")
        async for line in response.aiter_lines()
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_openai_completions_stream(rollout: httpx2.AsyncClient) -> None:
    request = {"model": "base", "prompt": [5, 6, 7], "max_tokens": 8, "seed": 5}
    whole = (await rollout.post("/v1/completions", json=request)).json()
    async with rollout.stream(
        "POST",
        "/v1/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = await read_sse(response)
    text_chunks = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == whole["choices"][0]["text"]
    assert [t for c in text_chunks for t in c["choices"][0]["loom"]["token_ids"]] == whole[
        "choices"
    ][0]["loom"]["token_ids"]
    assert text_chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == whole["usage"]


async def test_openai_chat(rollout: httpx2.AsyncClient) -> None:
    request = {
        "model": "base",
        "messages": [{"role": "system", "content": "add"}, {"role": "user", "content": "2+2="}],
        "max_completion_tokens": 8,
        "seed": 2,
        "logprobs": True,
        "top_logprobs": 2,
    }
    response = await rollout.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["logprobs"]["content"]) == len(choice["loom"]["token_ids"])
    assert all(len(t["top_logprobs"]) <= 3 for t in choice["logprobs"]["content"])
    tokenized = (
        await rollout.post(
            "/v1/tokenize",
            json={
                "texts": [
                    "<|im_start|>system\nadd<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n"
                    "<|im_start|>assistant\n"
                ]
            },
        )
    ).json()["token_ids"][0]
    assert body["loom"]["prompt_token_ids"] == [tokenized]  # the tokenizer's chat template

    async with rollout.stream(
        "POST", "/v1/chat/completions", json={**request, "stream": True}
    ) as stream:
        chunks = await read_sse(stream)
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks)
    assert streamed == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


async def test_openai_models_and_unknown_model(
    rollout: httpx2.AsyncClient, tiny_model_dir: Path
) -> None:
    models = (await rollout.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == str(tiny_model_dir)
    response = await rollout.post("/v1/completions", json={"model": "gpt/4", "prompt": "x"})
    assert response.status_code == 404
    assert "Unknown model 'gpt/4'" in response.json()["error"]["message"]


# --- hand-off from modelstate ------------------------------------------------------------------


async def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout
    while not await condition():
        assert time.perf_counter() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_full_version_hand_off(
    rollout: httpx2.AsyncClient, store: ModelStateClient, tiny_model_dir: Path, tmp_path: Path
) -> None:
    base = await sample(rollout, job_id="full-job")
    assert base["version"] == 0  # no versions yet: latest is the base
    weights = perturbed_copy(tiny_model_dir, tmp_path / "full", scale=1.5)
    await store.publish(
        VersionMeta(job_id="full-job", kind=VersionKind.full, base_model=str(tiny_model_dir)),
        weights,
    )
    published = time.perf_counter()
    first = await sample(rollout, job_id="full-job")  # `latest`, right after the publish
    TIMINGS["full_publish_to_first_sample_s"] = time.perf_counter() - published
    assert first["version"] == 1 and first["samples"][0]["version"] == 1
    assert first["samples"][0]["logprobs"] != base["samples"][0]["logprobs"]
    resident = (await rollout.get("/v1/versions")).json()
    assert resident["full"] == {"job_id": "full-job", "number": 1, "kind": "full"}

    # Swapping back and forth gives each version its own, unchanged results.
    again_base = await sample(rollout, job_id="full-job", version=0)
    assert again_base["samples"] == base["samples"]
    started = time.perf_counter()
    again_full = await sample(rollout, job_id="full-job", version=1)
    TIMINGS["full_swap_and_sample_s"] = time.perf_counter() - started
    assert again_full["samples"] == first["samples"]


async def test_cached_prefixes_of_other_weights_are_never_reused(
    rollout: httpx2.AsyncClient,
) -> None:
    """Swaps keep vLLM's prefix cache (128-token blocks on CPU): when a prompt's blocks from
    other weights are cached, a sample must still be computed by its own weights. Scored as a
    prompt (which never reads the cache), its tokens get back the logprobs it was sampled with.
    Back on weights seen before, their own cached blocks serve again."""
    long_prompt = (PROMPT * 60)[:300]  # two whole cache blocks
    for version in (0, 1, 0, 1):  # from the second on, the other weights' blocks are cached
        drawn = (
            await sample(
                rollout,
                job_id="full-job",
                version=version,
                prompt_token_ids=long_prompt,
                params={"max_tokens": 6, "temperature": 0.0},
            )
        )["samples"][0]
        scored = await sample(
            rollout,
            job_id="full-job",
            version=version,
            prompt_token_ids=long_prompt + drawn["token_ids"],
            params={"max_tokens": 1},
            prompt_logprobs=True,
        )
        assert scored["prompt_logprobs"][len(long_prompt) :] == pytest.approx(
            drawn["logprobs"], abs=2e-3
        ), f"version {version}"


async def test_in_flight_samples_finish_on_their_version(rollout: httpx2.AsyncClient) -> None:
    long = {"params": {"max_tokens": 200, "seed": 4}}
    results = await asyncio.gather(
        sample(rollout, job_id="full-job", version=0, n=4, **long),
        sample(rollout, job_id="full-job", version=1, n=4, **long),
        sample(rollout, job_id="full-job", version=0, **long),
    )
    assert [r["version"] for r in results] == [0, 1, 0]  # the service checks vLLM's labels


async def test_lora_version_hand_off(
    rollout: httpx2.AsyncClient, store: ModelStateClient, tiny_model_dir: Path, tmp_path: Path
) -> None:
    base = await sample(rollout)
    adapter = lora_adapter(tiny_model_dir, tmp_path / "lora", seed=0, rank=8)
    await store.publish(
        VersionMeta(job_id="lora-job", kind=VersionKind.lora, base_model=str(tiny_model_dir)),
        adapter,
    )
    published = time.perf_counter()
    first = await sample(rollout, job_id="lora-job")
    TIMINGS["lora_publish_to_first_sample_s"] = time.perf_counter() - published
    assert first["version"] == 1
    assert first["samples"][0]["logprobs"] != base["samples"][0]["logprobs"]

    # The follower pre-loads what is published: the adapter becomes resident without a request.
    second = lora_adapter(tiny_model_dir, tmp_path / "lora2", seed=1, rank=8)
    await store.publish(
        VersionMeta(job_id="lora-job", kind=VersionKind.lora, base_model=str(tiny_model_dir)),
        second,
    )
    published = time.perf_counter()

    async def resident() -> bool:
        loras = (await rollout.get("/v1/versions")).json()["loras"]
        return {"job_id": "lora-job", "number": 2, "kind": "lora"} in loras

    await wait_for(resident)
    TIMINGS["lora_publish_to_preloaded_s"] = time.perf_counter() - published
    started = time.perf_counter()
    body = await sample(rollout, job_id="lora-job")
    TIMINGS["lora_preloaded_first_sample_s"] = time.perf_counter() - started
    assert body["version"] == 2 and body["samples"] != first["samples"]
    chat = await rollout.post(
        "/v1/chat/completions",
        json={
            "model": "lora-job@1",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
    )
    assert chat.status_code == 200 and chat.json()["loom"] == {
        "job_id": "lora-job",
        "version": 1,
        "trajectory_id": None,
        "prompt_token_ids": chat.json()["loom"]["prompt_token_ids"],
    }


class Publisher:
    """Publishes versions of one job (seeded LoRA adapters or perturbed full weights)."""

    def __init__(
        self,
        store: ModelStateClient,
        tiny_model_dir: Path,
        tmp_path: Path,
        job_id: str,
        kind: VersionKind,
    ) -> None:
        self.store, self.base, self.tmp_path = store, tiny_model_dir, tmp_path
        self.job_id, self.kind = job_id, kind

    async def publish(self, seed: int) -> None:
        directory = self.tmp_path / f"v{seed}"
        weights = (
            lora_adapter(self.base, directory, seed=seed, rank=8)
            if self.kind == VersionKind.lora
            else perturbed_copy(self.base, directory, 1 + seed / 10)
        )
        await self.store.publish(
            VersionMeta(job_id=self.job_id, kind=self.kind, base_model=str(self.base)), weights
        )

    async def rollouts_while_publishing(
        self, rollout: httpx2.AsyncClient, body: dict[str, Any], seed: int
    ) -> list[dict[str, Any]]:
        """The events of a rollout request during which version `seed` is published, 0.5 s
        in (the request's long generations take seconds on this CPU)."""

        async def publish_mid_generation() -> None:
            await asyncio.sleep(0.5)
            await self.publish(seed)

        response, _ = await asyncio.gather(
            rollout.post("/v1/rollouts", json=body), publish_mid_generation()
        )
        # NDJSON lines end at "\n" only: sampled text may hold U+2028 or U+0085, which
        # str.splitlines() would also split at.
        return [json.loads(line) for line in response.text.split("\n") if line]


@pytest.mark.parametrize("kind", [VersionKind.lora, VersionKind.full])
async def test_partial_rollouts_continue_on_a_version_published_mid_generation(
    rollout: httpx2.AsyncClient,
    store: ModelStateClient,
    tiny_model_dir: Path,
    tmp_path: Path,
    kind: VersionKind,
) -> None:
    """Long generations are running when version 2 is published: each continues on it from
    the tokens it has, so its turn has a part per version, and no token is lost."""
    job_id = f"partial-{kind.value}"
    versions = Publisher(store, tiny_model_dir, tmp_path, job_id, kind)
    await versions.publish(1)
    body = {
        "job_id": job_id,
        "env": "arithmetic",
        "group_size": 16,
        "tasks": [{"prompt": "1+1=", "reference": "2"}],
        "params": {"max_tokens": 400, "seed": 3},
        "version_refresh": "partial",
    }
    events = await versions.rollouts_while_publishing(rollout, body, 2)
    (group,) = [e["group"] for e in events if e["type"] == "group"]
    interrupted = 0
    for trajectory in group["trajectories"]:
        turns = trajectory["turns"]
        assert all(t["kind"] == "model" for t in turns)
        assert [t["start"] for t in turns[1:]] == [t["end"] for t in turns[:-1]]
        assert turns[-1]["end"] == len(trajectory["token_ids"]) == len(trajectory["logprobs"])
        assert set(trajectory["loss_mask"]) == {1}
        versions_seen = [t["version"] for t in turns]
        assert versions_seen in ([1], [2], [1, 2]), versions_seen
        interrupted += versions_seen == [1, 2]
    assert interrupted > 0, "no generation was running when version 2 was published"


async def test_max_staleness_cancels_stale_groups_and_not_the_later_ones(
    rollout: httpx2.AsyncClient, store: ModelStateClient, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Four groups of 8 with room for 8 episodes at once, max_staleness 0. Version 2 is
    published while the first group generates on version 1: the groups that started on 1
    are cancelled (a 'stale' error each); those that had to wait for a slot start on 2 and
    are delivered, though the request came when version 1 was the newest."""
    versions = Publisher(store, tiny_model_dir, tmp_path, "stale-lora", VersionKind.lora)
    await versions.publish(1)
    body = {
        "job_id": "stale-lora",
        "env": "arithmetic",
        "group_size": 8,
        "concurrency": 8,
        "tasks": [{"prompt": f"{i}+1=", "reference": str(i + 1)} for i in range(4)],
        "params": {"max_tokens": 400, "seed": 3},
        "max_staleness": 0,
    }
    events = await versions.rollouts_while_publishing(rollout, body, 2)
    stale = [e["error"] for e in events if e["type"] == "error"]
    groups = [e["group"] for e in events if e["type"] == "group"]
    assert stale and groups, events
    assert {e["code"] for e in stale} == {"stale"}
    assert all("started on version 1 " in e["message"] for e in stale)
    assert 0 in {e["detail"]["task_index"] for e in stale}  # the first group started on 1
    fresh = [g for g in groups if {t["turns"][0]["version"] for t in g["trajectories"]} == {2}]
    assert fresh, "no group of the request started on version 2"


async def test_load_endpoint_and_unknown_versions(
    rollout: httpx2.AsyncClient, store: ModelStateClient
) -> None:
    loaded = await rollout.post("/v1/load", json={"job_id": "lora-job", "version": 1})
    assert loaded.json() == {"job_id": "lora-job", "number": 1, "kind": "lora"}
    missing = await rollout.post("/v1/load", json={"job_id": "lora-job", "version": 9})
    assert missing.status_code == 404
    response = await rollout.post("/v1/completions", json={"model": "lora-job@9", "prompt": "x"})
    assert response.status_code == 404

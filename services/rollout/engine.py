"""The one vLLM engine of a rollout process: start-up with warm-up, generation, tokenizer,
in-place weight reloads and LoRA adapters. Version bookkeeping lives in `versions.py`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from services.common.busy import BusyClock
from services.common.errors import Unavailable
from services.rollout.cpu_cores import CoreSlot, bind_engine_threads
from services.rollout.settings import RolloutSettings
from services.rollout.vllm_plugin import BUSY_POLL_ENV

if TYPE_CHECKING:  # vLLM is heavy to import: only the engine's own start-up pays for it
    from vllm import RequestOutput, SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)
CPU_BATCHED_TOKENS = 2048  # tokens per engine step on CPU (vLLM's own CPU default)

BASE_WEIGHTS_LABEL = "base"
UNKNOWN_WEIGHTS_LABEL = "unknown"  # after a failed reload: the weights may be half replaced


class RolloutEngine:
    """Owns one `AsyncLLM`. Every method but `start` needs a started engine."""

    def __init__(self, settings: RolloutSettings, model_path: str, busy: BusyClock) -> None:
        self.settings = settings
        self.model_path = model_path
        self.busy = busy
        self._llm: AsyncLLM | None = None
        self.start_error: str | None = None
        self.warmup_seconds: float | None = None
        self.startup_seconds: float | None = None
        self._weights_label = BASE_WEIGHTS_LABEL
        self.requests_in_flight = 0  # the load a replica reports to the gateway
        self.tokens_in_flight = 0  # their prompt tokens plus token budgets
        self.core_slot: CoreSlot | None = None  # held while the process lives

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            if self.start_error:
                raise Unavailable(f"The rollout engine failed to start: {self.start_error}")
            raise Unavailable("The rollout engine is still starting; retry shortly.")
        return self._llm

    @property
    def ready(self) -> bool:
        return self._llm is not None and self.warmup_seconds is not None

    async def start(self) -> None:
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        # Read by the engine processes vLLM spawns, so they must be set before they start.
        os.environ[BUSY_POLL_ENV] = str(self.settings.rollout_cpu_busy_poll_ms)
        if current_platform.is_cpu():
            settings = self.settings
            self.core_slot = bind_engine_threads(
                explicit=settings.rollout_cpu_cores,
                per_replica=settings.rollout_cpu_cores_per_replica,
                ranks=settings.rollout_tensor_parallel_size * settings.rollout_data_parallel_size,
                slots_dir=settings.rollout_cpu_slots_dir,
            )
        args = engine_args(self.settings, self.model_path)
        started = time.perf_counter()
        # Built off the event loop (tens of seconds) so /healthz answers meanwhile; the
        # engine's output loop starts lazily on the first request, on this loop.
        build = asyncio.get_running_loop().run_in_executor(None, AsyncLLM.from_engine_args, args)
        try:
            self._llm = await asyncio.shield(build)
        except asyncio.CancelledError:
            # A build cannot be interrupted: let it finish, then stop the processes it spawned.
            (await build).shutdown()
            raise
        except Exception as exc:
            self.start_error = f"{type(exc).__name__}: {exc}"
            raise
        self.startup_seconds = time.perf_counter() - started
        await self.label_weights(BASE_WEIGHTS_LABEL)
        await self._warm_up()

    async def _warm_up(self) -> None:
        """Pay one-time costs before the first user request does. The expensive one: vLLM
        computes the rank of each sampled token with a `torch.compile`d kernel
        (`batched_count_greater_than`), compiled by Inductor on the first request that asks for
        logprobs (5 s idle, ~25 s on a busy 2-core machine), and compiled again for the first
        batch of another size (then shapes are dynamic). So: logprobs at batch 1, then batch 2,
        with the sampling options user requests take (seeded, top-p/top-k)."""
        from vllm import SamplingParams

        started = time.perf_counter()
        prompt = [0, 1, 2, 3]
        await self.generate(prompt, SamplingParams(max_tokens=2, logprobs=0))
        await self.generate(prompt, SamplingParams(max_tokens=2, logprobs=0, n=2, seed=0))
        await self.generate(prompt, SamplingParams(max_tokens=2, logprobs=0, top_p=0.9, top_k=8))
        self.warmup_seconds = time.perf_counter() - started
        log.info(
            "rollout engine started in %.1f s, warmed up in %.1f s",
            self.startup_seconds or 0.0,
            self.warmup_seconds,
        )

    # --- generation ---------------------------------------------------------------------

    async def stream(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        lora_request: LoRARequest | None = None,
        interrupt: asyncio.Future[Any] | None = None,
        movable: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs as vLLM produces them (cumulative or delta, per `params.output_kind`).
        When `interrupt` completes first, the request is aborted and its last output (finish
        reason `abort`) holds the tokens sampled so far. `movable`: later weights may be
        swapped in under this request (see `reload_weights`)."""
        request_id = uuid.uuid4().hex
        watcher = (
            None
            if interrupt is None
            else asyncio.ensure_future(self._abort_on(interrupt, request_id))
        )
        prompt = {"prompt_token_ids": prompt_token_ids, "cache_salt": self._cache_salt(movable)}
        # The work it may still take: prompt plus every sample's token budget.
        tokens = len(prompt_token_ids) + (getattr(params, "max_tokens", 0) or 0) * getattr(
            params, "n", 1
        )
        self.requests_in_flight += 1
        self.tokens_in_flight += tokens
        try:
            with self.busy.busy():
                async for output in self.llm.generate(
                    prompt,
                    params,
                    request_id,
                    lora_request=lora_request,  # type: ignore[arg-type]
                ):
                    yield output
        finally:
            self.requests_in_flight -= 1
            self.tokens_in_flight -= tokens
            if watcher is not None:
                watcher.cancel()

    def _cache_salt(self, movable: bool) -> str:
        """vLLM shares KV blocks between requests whose prefixes hash alike, and the salt
        joins the hash. Naming the weights loaded (requests start only on the weights they
        asked for, see `WeightsGate`) keeps other weights' blocks out of every request, so a
        swap need not clear the prefix cache, and blocks of weights swapped back in serve
        again. A moved generation's later blocks are computed by later weights than its salt
        names: movable requests share blocks only among themselves."""
        return f"{self._weights_label}+movable" if movable else self._weights_label

    async def _abort_on(self, interrupt: asyncio.Future[Any], request_id: str) -> None:
        await asyncio.shield(interrupt)  # the caller owns (and cancels) the future
        await self.llm.abort(request_id)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        lora_request: LoRARequest | None = None,
        interrupt: asyncio.Future[Any] | None = None,
        movable: bool = False,
    ) -> RequestOutput:
        final: RequestOutput | None = None
        async for output in self.stream(prompt_token_ids, params, lora_request, interrupt, movable):
            final = output
        if final is None:  # vLLM always yields a finished output; this guards the type
            raise RuntimeError("vLLM returned no output")
        return final

    # --- tokenizer and limits -----------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    @property
    def vocab_size(self) -> int:
        return int(self.llm.model_config.get_vocab_size())

    @property
    def max_model_len(self) -> int:
        return int(self.llm.model_config.max_model_len)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids))

    # --- weights ------------------------------------------------------------------------

    async def reload_weights(self, weights_path: str, label: str) -> None:
        """Replace the full weights in place, between engine steps. Requests still running
        (only generations that may move to newer weights are, see `WeightsGate`) are frozen,
        then go on with the new weights: on their KV so far, which the old weights computed
        (`LOOM_ROLLOUT_INFLIGHT_KV=keep`, as PipelineRL does), or after recomputing their
        tokens so far with the new weights (`recompute`: the caches are cleared, which preempts
        them). Tokens sampled from then on carry `label`. Cached prefixes of other weights stay
        out of later requests either way (`_cache_salt`). vLLM drops every LoRA adapter too
        (they were merged against the old base)."""
        await self._pause(clear_cache=self.settings.rollout_inflight_kv == "recompute")
        try:
            await self.llm.collective_rpc(
                "loom_reload_weights", kwargs={"weights_path": weights_path}
            )
        except BaseException:
            await self.label_weights(UNKNOWN_WEIGHTS_LABEL)  # no token may claim the old ones
            raise
        else:
            await self.label_weights(label)
        finally:
            await self.llm.resume_generation()

    async def _pause(self, clear_cache: bool) -> None:
        """`AsyncLLM.pause_generation(mode="keep", clear_cache=...)` without its closing 20 ms
        sleep, which only orders the outputs of requests aborted or finished meanwhile. "keep"
        freezes running requests; clearing the caches also preempts them, so they resume by
        recomputing their KV."""
        await self.llm.renderer.clear_mm_cache_async()
        await self.llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=clear_cache)

    async def label_weights(self, label: str) -> None:
        """vLLM tags every output token with this label (`CompletionOutput.weight_versions`),
        which lets the sampler check which weights produced a sample."""
        await self.llm.update_weight_version(label)
        self._weights_label = label

    async def add_lora(self, lora_request: LoRARequest) -> None:
        await self.llm.add_lora(lora_request)

    async def remove_lora(self, lora_int_id: int) -> None:
        await self.llm.remove_lora(lora_int_id)

    def shutdown(self) -> None:
        """Stop the EngineCore and worker processes (waits for them to exit)."""
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None


def engine_args(settings: RolloutSettings, model_path: str) -> AsyncEngineArgs:
    """The engine's arguments (benchmarks build a bare engine from the same)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_path,
        dtype=settings.rollout_dtype,
        enforce_eager=settings.rollout_enforce_eager,
        max_model_len=settings.rollout_max_model_len,
        seed=settings.rollout_seed,
        # The logprob of each sampled token under the distribution it was drawn from (after
        # temperature and top-p/top-k), not under the raw logits: what trainers take a ratio to.
        logprobs_mode="processed_logprobs",
        disable_log_stats=True,
        tensor_parallel_size=settings.rollout_tensor_parallel_size,
        data_parallel_size=settings.rollout_data_parallel_size,
        gpu_memory_utilization=settings.rollout_gpu_memory_utilization,
        worker_extension_cls="services.rollout.worker_extension.LoomWorkerExtension",
        **_lora(settings),
        **_cpu_scheduling(settings),
    )


def _lora(settings: RolloutSettings) -> dict[str, Any]:
    if not settings.rollout_max_loras:
        return {"enable_lora": False}
    return {
        "enable_lora": True,
        "max_lora_rank": settings.rollout_max_lora_rank,
        "max_loras": settings.rollout_max_loras,
    }


def _cpu_scheduling(settings: RolloutSettings) -> dict[str, Any]:
    """On CPU, never split a prompt across engine steps. vLLM rewinds a seeded request's
    random generator after a partial prefill step, which the CPU generator cannot do
    (`RuntimeError: CPU Generator does not use offset`), and the engine dies: any seeded
    request arriving while more than a step's worth of prompt tokens is queued would kill it.
    Whole prompts per step cost nothing here (no GPU memory peaks to smooth).
    The KV cache is sized in bytes (`kv_cache_memory_bytes`): vLLM's VLLM_CPU_KVCACHE_SPACE
    takes whole GiB, which is hundreds of times what a tiny model needs. vLLM lets that
    variable override the argument, so it is dropped from the environment its processes
    inherit."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(CPU_BATCHED_TOKENS, settings.rollout_max_model_len),
        "kv_cache_memory_bytes": settings.kv_cache_bytes,
    }

"""Methods vLLM mixes into each of its workers (engine arg `worker_extension_cls`), called
with `collective_rpc("<method>")`. They run inside the worker process, next to the model."""

from __future__ import annotations

import gc
from typing import Any

from vllm.distributed.device_communicators import shm_broadcast


class LoomWorkerExtension:
    # Set by vLLM's Worker, which this class is mixed into.
    model_runner: Any

    def loom_queue_busy_loop_s(self) -> list[float]:
        """How long each message queue this worker reads busy-polls after a message."""
        # type(), not isinstance(): the heap holds dead weak proxies, which raise on that.
        return [
            float(queue._spin_condition.busy_loop_s)
            for queue in gc.get_objects()
            if issubclass(type(queue), shm_broadcast.MessageQueue) and queue._is_local_reader
        ]

    def loom_reload_weights(self, weights_path: str) -> None:
        """Reload full weights in place, keeping tied input/output embeddings tied.

        vLLM's layer-wise in-place reload gives the embedding a new tensor but puts the LM
        head's old one back (the checkpoint of a tied model has no `lm_head.weight`), so the
        head would keep scoring with the previous weights: greedy tokens still look plausible
        while every logprob is wrong. Re-share the tensor after the reload (tested end to end:
        sampled logprobs must equal the trainer's for the same tokens)."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()
        hf_config = self.model_runner.model_config.hf_text_config
        if not getattr(hf_config, "tie_word_embeddings", False):
            return
        head = getattr(model, "lm_head", None)
        # vLLM's decoder-only models name their input embedding `embed_tokens`.
        embeddings = next(
            (m for name, m in model.named_modules() if name.endswith("embed_tokens")), None
        )
        if head is None or embeddings is None or head is embeddings:
            return
        head.weight = embeddings.weight
        # Kernels prepared from the old tensor (vLLM's CPU GEMM binds a oneDNN handle to it)
        # must be rebuilt for the new one.
        quant_method = getattr(head, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(head)

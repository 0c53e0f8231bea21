"""The embedded engine's decode step over fixed-shape buffers, replayed as CUDA graphs on a GPU.

On a GPU a small model's eager decode step is bound by kernel launches and Python, not by the arithmetic (a
Qwen2.5-0.5B step at batch 64 launches ~400 kernels). `DecodeGraphs` runs the step as one CUDA graph replay: the
step reads its inputs (token, slot, position per row) from static device buffers, writes the new keys and values
into the slot KV cache and the logits into a static output, with no host synchronisation and no allocation inside.

Shapes are fixed per graph: the batch is padded to a bucket (`BATCH_BUCKETS`) and attention reads a power-of-two
span of cache positions (`span_bucket`), masked past each row's own length. A padded row writes its key and value
at the cache's last position of slot 0, which no sequence holds at a decode step (the engine keeps one position
spare: `make_room` in inference/embedded/scheduler.py), and its logits are dropped. Graphs are captured lazily, one
per (bucket, span), and read the model's weights and the cache's buffers in place: a weight update copied into the
same tensors (`EmbeddedEngine.update_weights_sync`) is seen by the next replay without a re-capture; a cache that
reallocates (it grows by doubling) drops the graphs, which are captured again on their next use.

`mode="eager"` runs the same static step without capturing it (any device, the tests' CPU path); the engine on a CPU
keeps its own decode path (`NativeCausalLM.forward`, the C kernels) and uses neither unless asked.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from thermik.inference.kv_cache import SlotKVCache
from thermik.inference.native_model import NativeCausalLM, _attention
from thermik.models.architecture import apply_rope, rms_norm

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_SPAN = 64  # positions: the smallest span bucket
WARMUP_STEPS = 2  # eager runs on the capture stream before a capture (cuBLAS handles and workspaces)
MODES = ("capture", "eager")


def batch_bucket(rows: int) -> int | None:
    """The smallest bucket holding `rows`, None past the largest."""
    return next((b for b in BATCH_BUCKETS if b >= rows), None)


def span_bucket(positions: int, max_len: int) -> int:
    """The cache positions attention reads for a step whose rows need `positions`: the next power of two (at least
    MIN_SPAN), at most the cache's length."""
    span = MIN_SPAN
    while span < positions:
        span *= 2
    return min(span, max_len)


@torch.inference_mode()
def static_decode(
    native: NativeCausalLM, cache: SlotKVCache, tokens: Tensor, slots: Tensor, positions: Tensor, span: int
) -> Tensor:
    """One decode step for rows (tokens[r] at positions[r] of slot slots[r]; each [B] long, on the model's device)
    attending to the first `span` positions of their slots; returns the float32 logits [B, V]. Every shape depends on
    B and `span` alone and no value is read back to the host, so the step can be captured in a CUDA graph."""
    batch = tokens.shape[0]
    nh, nkv, hd = native.num_heads, native.num_kv_heads, native.head_dim
    cos, sin = native._cos[positions][:, None, None], native._sin[positions][:, None, None]  # [B, 1, 1, D]
    keys = torch.arange(span, device=tokens.device)
    mask = torch.zeros(batch, span, dtype=native._cos.dtype, device=tokens.device)
    mask = mask.masked_fill_(keys[None] > positions[:, None], float("-inf"))[:, None, None]  # [B, 1, 1, span]
    x = F.embedding(tokens, native.embed.weight)[:, None]  # [B, 1, hidden]
    for i, layer in enumerate(native.layers):
        qkv = layer.qkv(rms_norm(x, layer.in_norm))
        qk, v = qkv.split(((nh + nkv) * hd, nkv * hd), dim=-1)
        qk = qk.view(batch, 1, nh + nkv, hd)
        if layer.q_norm is not None:
            qk = torch.cat([rms_norm(qk[:, :, :nh], layer.q_norm), rms_norm(qk[:, :, nh:], layer.k_norm)], 2)
        q, k = apply_rope(qk.transpose(1, 2), cos, sin).split((nh, nkv), dim=1)  # [B, heads, 1, D]
        k_buf, v_buf = cache.keys[i], cache.values[i]
        k_buf[slots, :, positions] = k[:, :, 0]
        v_buf[slots, :, positions] = v.view(batch, nkv, hd)
        attn = _attention(q, k_buf[slots, :, :span], v_buf[slots, :, :span], mask, nkv)
        x = x + layer.o(attn.transpose(1, 2).reshape(batch, 1, nh * hd))
        gate, up = layer.gate_up(rms_norm(x, layer.post_norm)).chunk(2, dim=-1)
        x = x + layer.down(F.silu(gate) * up)
    return native.lm_head(rms_norm(x[:, 0], native.final_norm)).float()


class _Step:
    """The static buffers of one (bucket, span) and, once captured, its graph."""

    def __init__(self, batch: int, span: int, device: torch.device) -> None:
        self.span = span
        self.tokens, self.slots, self.positions = (torch.zeros(batch, dtype=torch.long, device=device) for _ in "tsp")
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None

    def scratch(self, max_len: int) -> None:
        """Point every row at the cache's spare position (what padded rows write to)."""
        self.tokens.zero_()
        self.slots.zero_()
        self.positions.fill_(max_len - 1)


class DecodeGraphs:
    """Decode steps of one engine over its `NativeCausalLM` and `SlotKVCache`; see the module docstring."""

    def __init__(self, native: NativeCausalLM, mode: str = "capture") -> None:
        if mode not in MODES:
            raise ValueError(f"decode graph mode must be one of {MODES}, got {mode!r}")
        device = native.embed.weight.device
        if mode == "capture" and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, this one is on {device}")
        self.native, self.mode, self.device = native, mode, device
        self._steps: dict[tuple[int, int], _Step] = {}
        self._cache_generation = -1
        self._pool = torch.cuda.graph_pool_handle() if mode == "capture" else None
        self._host = torch.zeros(3, BATCH_BUCKETS[-1], dtype=torch.long, pin_memory=mode == "capture")
        self.captures = 0  # graphs captured so far (tests: an update must not add any)
        self.replays = 0

    def fits(self, rows: int) -> bool:
        return batch_bucket(rows) is not None

    @torch.inference_mode()
    def decode(
        self, cache: SlotKVCache, tokens: Sequence[int], slots: Sequence[int], positions: Sequence[int]
    ) -> Tensor:
        """Logits [len(tokens), V] of one decode step (row r: tokens[r] at positions[r] of slot slots[r]). The
        positions must be below the cache's last one, which padded rows write to."""
        rows = len(tokens)
        bucket = batch_bucket(rows)
        if bucket is None or rows == 0:
            raise ValueError(f"a decode graph step takes 1 to {BATCH_BUCKETS[-1]} rows, got {rows}")
        self._check_cache(cache)
        step = self._step(bucket, span_bucket(max(positions) + 1, cache.max_len), cache)
        host = self._host[:, :bucket]
        host[0, :rows], host[1, :rows], host[2, :rows] = (torch.as_tensor(v) for v in (tokens, slots, positions))
        host[0, rows:], host[1, rows:], host[2, rows:] = 0, 0, cache.max_len - 1
        staged = host.to(self.device, non_blocking=True)
        step.tokens.copy_(staged[0])
        step.slots.copy_(staged[1])
        step.positions.copy_(staged[2])
        if step.graph is not None:
            step.graph.replay()
            self.replays += 1
        else:
            step.logits = static_decode(self.native, cache, step.tokens, step.slots, step.positions, step.span)
        assert step.logits is not None
        return step.logits[:rows]

    def _check_cache(self, cache: SlotKVCache) -> None:
        """Drop the graphs when the cache's buffers were reallocated (they hold the old ones)."""
        if cache.generation != self._cache_generation:
            self._steps.clear()
            if self._pool is not None:  # the dropped graphs were the old pool's last users: it is gone with them
                self._pool = torch.cuda.graph_pool_handle()
            self._cache_generation = cache.generation

    def _step(self, bucket: int, span: int, cache: SlotKVCache) -> _Step:
        step = self._steps.get((bucket, span))
        if step is None:
            step = self._steps[(bucket, span)] = _Step(bucket, span, self.device)
            if self.mode == "capture":
                self._capture(step, cache)
        return step

    def _capture(self, step: _Step, cache: SlotKVCache) -> None:
        """Warm up on a side stream, then capture; the warm-ups write only the cache's spare position."""
        step.scratch(cache.max_len)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                static_decode(self.native, cache, step.tokens, step.slots, step.positions, step.span)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work (the trainer's, in an RL run) does not break the capture
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step.logits = static_decode(self.native, cache, step.tokens, step.slots, step.positions, step.span)
        step.graph = graph
        self.captures += 1

"""A slot KV cache: one preallocated [slots, kv_heads, length, head_dim] key and value buffer per layer.

A slot holds one sequence. Buffers grow by doubling (slots or length) when a request needs more room, so a
steady workload allocates nothing per step and a small one does not reserve gigabytes up front. An optional
byte budget caps slots x length: growth that would pass it grows to exactly what was asked for, and a request
for more than the budget holds raises `KVCacheBudgetError` (the engine evicts idle slots and admits fewer
requests so that it never asks; see `EmbeddedEngine`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

DEFAULT_BUDGET_FRACTION = 0.25


class KVCacheBudgetError(MemoryError):
    """The KV cache was asked to hold more than its byte budget."""


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what the kernel can hand out without swapping), else total RAM; None where
    neither can be read."""
    try:
        for line in open("/proc/meminfo").read().splitlines():  # noqa: SIM115  (a one-shot read)
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf names on this platform
        return None


def default_budget_bytes(device: torch.device) -> int | None:
    """A quarter of the memory the cache would live in, as available when the engine is built: free RAM on CPU, free
    memory on a CUDA device. The rest is for what shares that memory in an RL run: the trainer's weights, gradients,
    optimizer moments and activations, and the engine's own weight copy. None (no budget) where the size cannot be
    read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * DEFAULT_BUDGET_FRACTION)
    available = available_memory_bytes()
    return None if available is None else int(available * DEFAULT_BUDGET_FRACTION)


def _runs(keep: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(destination row, source row, count) for each run of consecutive source rows in `keep`."""
    start = 0
    for j in range(1, len(keep) + 1):
        if j == len(keep) or keep[j] != keep[j - 1] + 1:
            yield start, keep[start], j - start
            start = j


class SlotKVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        budget_bytes: int | None = None,
    ) -> None:
        self.shape_tail = (num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.bytes_per_position = num_layers * 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).itemsize
        self.budget_bytes = budget_bytes
        if budget_bytes is not None:  # start small enough for the budget
            positions = budget_bytes // self.bytes_per_position
            if positions < 1:
                raise KVCacheBudgetError(
                    f"a KV cache budget of {budget_bytes} bytes holds no position of {self.bytes_per_position} bytes"
                )
            max_len = min(max_len, positions)
            num_slots = max(1, min(num_slots, positions // max_len))
        self.keys = [self._empty(num_slots, max_len) for _ in range(num_layers)]
        self.values = [self._empty(num_slots, max_len) for _ in range(num_layers)]
        self.generation = 0  # bumped whenever the buffers are reallocated (CUDA graphs hold the old ones)

    def _empty(self, num_slots: int, max_len: int) -> Tensor:
        heads, dim = self.shape_tail
        return torch.zeros(num_slots, heads, max_len, dim, dtype=self.dtype, device=self.device)

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes the key and value buffers hold now."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def budget_positions(self) -> int | None:
        """Slot-positions (slots x length) the budget holds; None without a budget."""
        return None if self.budget_bytes is None else self.budget_bytes // self.bytes_per_position

    def fits(self, num_slots: int, max_len: int) -> bool:
        return self.budget_bytes is None or num_slots * max_len * self.bytes_per_position <= self.budget_bytes

    def ensure(self, num_slots: int, max_len: int) -> None:
        """Grow (by doubling) to at least `num_slots` slots of `max_len` positions, keeping the contents of the
        first `num_slots` slots (rows past them may be dropped). Where doubling would pass the budget, grow the
        length to exactly `max_len` and the slots to as many as fit; past the budget, raise KVCacheBudgetError."""
        if num_slots <= self.num_slots and max_len <= self.max_len:
            return
        new_slots, new_len = self.num_slots, self.max_len
        while new_slots < num_slots:
            new_slots *= 2
        while new_len < max_len:
            new_len *= 2
        if not self.fits(new_slots, new_len):
            new_len = max(max_len, self.max_len)
            if not self.fits(num_slots, new_len):
                raise KVCacheBudgetError(
                    f"{num_slots} slots x {new_len} positions x {self.bytes_per_position} bytes exceed the KV cache "
                    f"budget of {self.budget_bytes} bytes"
                )
            new_slots = max(num_slots, min(new_slots, self.budget_bytes // (new_len * self.bytes_per_position)))
        self.resize(range(min(self.num_slots, new_slots)), new_slots, new_len)

    def resize(self, keep: Sequence[int], num_slots: int, max_len: int) -> None:
        """Reallocate as `num_slots` slots of `max_len` positions; slot j takes the contents of old slot `keep[j]`
        (cut to `max_len` positions). Buffers are replaced one at a time, so the peak is the larger of the old and
        the new cache plus one layer's key (or value) buffer."""
        if len(keep) > num_slots:
            raise ValueError(f"cannot keep {len(keep)} slots in {num_slots}")
        length = min(max_len, self.max_len)
        self.generation += 1
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = self._empty(num_slots, max_len)
                for dst, src, count in _runs(keep):
                    new[dst : dst + count, :, :length] = old[src : src + count, :, :length]
                buffers[i] = new
                del old  # the old buffer goes before the next one is allocated

    def copy_slot(self, src: int, dst: int | Sequence[int], length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst`, or into each slot of a list (a shared
        prompt prefix; one indexed copy per buffer for the whole list)."""
        if not isinstance(dst, int):
            if not dst:
                return
            dst = torch.tensor(dst, device=self.keys[0].device)
        for buffers in (self.keys, self.values):
            for buf in buffers:
                buf[dst, :, :length] = buf[src, :, :length]

    def write(
        self, layer: int, rows: Tensor | slice, positions: Tensor, k: Tensor, v: Tensor, span: int
    ) -> tuple[Tensor, Tensor]:
        """Store k, v [B, kv_heads, T, head_dim] at `positions` [B, T] of `rows` (a slice of slots, or slot ids
        [B, 1]); return the keys and values [B, kv_heads, span, head_dim] those rows attend to."""
        kb, vb = self.keys[layer], self.values[layer]
        if isinstance(rows, slice):
            kb, vb = kb[rows], vb[rows]
            index = torch.arange(kb.shape[0], device=kb.device)[:, None]
        else:
            index = rows
        kb[index, :, positions] = k.transpose(1, 2)
        vb[index, :, positions] = v.transpose(1, 2)
        if isinstance(rows, slice):
            return kb[:, :, :span], vb[:, :, :span]
        return kb[rows[:, 0], :, :span], vb[rows[:, 0], :, :span]

"""A slot KV cache: one preallocated [slots, kv_heads, length, head_dim] key and value buffer per layer.

A slot holds one sequence. Buffers grow by doubling (slots or length) when a request needs more room, so a
steady workload allocates nothing per step and a small one does not reserve gigabytes up front.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
    ) -> None:
        self.shape_tail = (num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.keys = [self._empty(num_slots, max_len) for _ in range(num_layers)]
        self.values = [self._empty(num_slots, max_len) for _ in range(num_layers)]

    def _empty(self, num_slots: int, max_len: int) -> Tensor:
        heads, dim = self.shape_tail
        return torch.zeros(num_slots, heads, max_len, dim, dtype=self.dtype, device=self.device)

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def ensure(self, num_slots: int, max_len: int) -> None:
        """Grow (by doubling) to at least `num_slots` slots of `max_len` positions, keeping the contents."""
        if num_slots <= self.num_slots and max_len <= self.max_len:
            return
        new_slots, new_len = self.num_slots, self.max_len
        while new_slots < num_slots:
            new_slots *= 2
        while new_len < max_len:
            new_len *= 2
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                grown = self._empty(new_slots, new_len)
                grown[: old.shape[0], :, : old.shape[2]] = old
                buffers[i] = grown

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst` (a shared prompt prefix)."""
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

"""The embedded engine's decode step: every running sequence is fed its last sampled token, and the next one is
sampled. On the native forward (a CPU) the step runs over the running rows; with decode graphs (a GPU) it is one
fixed-shape step replayed as a CUDA graph (inference/decode_graphs.py)."""

from __future__ import annotations

import torch

from thermik.inference.decode_graphs import MODES, DecodeGraphs
from thermik.inference.embedded.records import SampleRecorder
from thermik.inference.embedded.requests import Counters
from thermik.inference.embedded.scheduler import SlotScheduler
from thermik.inference.native_model import NativeCausalLM


class Decoder:
    """One decode step of every running request, then sampling records (`SampleRecorder`)."""

    def __init__(
        self,
        native: NativeCausalLM,
        graphs: DecodeGraphs | None,
        scheduler: SlotScheduler,
        records: SampleRecorder,
        counters: Counters,
    ) -> None:
        self.native = native
        self.graphs = graphs
        self.scheduler = scheduler
        self.records = records
        self.counters = counters

    def step(self) -> None:
        """Feed every running sequence its last sampled token; sample the next one."""
        scheduler = self.scheduler
        running = [i for i in scheduler.running() if not scheduler.drop_cancelled(i)]
        if not running:
            return
        # Idle rows of a dense step write at their length, which every slot keeps below the cache's.
        scheduler.make_room(max(len(scheduler.slots[i].tokens) for i in running) + 2, running)
        running = scheduler.running()  # renumbered if idle slots were evicted
        if self.graphs is not None and self.graphs.fits(len(running)):
            return self._step_static(running)
        slots = scheduler.slots
        hi = running[-1] + 1
        dense = 2 * len(running) >= hi  # mostly-busy rows: compute on the contiguous slice, reading views
        index = list(range(hi)) if dense else running
        tokens = torch.tensor([[slots[i].next_token] for i in index])
        starts = torch.tensor([len(slots[i].tokens) for i in index])
        rows = slice(0, hi) if dense else torch.tensor(running)
        zeros = torch.zeros(len(index), dtype=torch.long)
        logits = self.native.forward(tokens, rows, starts, zeros, scheduler.cache)
        self.counters.forwards += 1
        for i in running:
            slots[i].tokens.append(slots[i].next_token)
        self.records.record([slots[i] for i in running], logits[running] if dense else logits)

    def _step_static(self, running: list[int]) -> None:
        """`step` as one fixed-shape step (a CUDA graph replay on a GPU): decode_graphs.py."""
        slots = [self.scheduler.slots[i] for i in running]
        tokens, lengths = [s.next_token for s in slots], [len(s.tokens) for s in slots]
        logits = self.graphs.decode(self.scheduler.cache, tokens, running, lengths)
        self.counters.forwards += 1
        for slot in slots:
            slot.tokens.append(slot.next_token)
        self.records.record(slots, logits)


def make_decode_graphs(native: NativeCausalLM, mode: str, device: torch.device) -> DecodeGraphs | None:
    """The engine's fixed-shape decode step for `mode` ("auto": captured on CUDA, none elsewhere), or None."""
    if mode not in ("auto", "off", *MODES):
        raise ValueError(f"decode_graphs must be 'auto', 'off', 'capture' or 'eager', got {mode!r}")
    if mode == "auto":
        mode = "capture" if device.type == "cuda" else "off"
    return None if mode == "off" else DecodeGraphs(native, mode)

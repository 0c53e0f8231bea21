"""Prefill planning: admitted requests are placed in slots and forward only what no slot holds yet.

The n samples of a group (identical prompts admitted together) share one prefill: one leader forwards, its
followers copy its cache rows. A prompt extending what a slot holds (a session's next turn) starts after it; one
sharing a longer prefix with another slot copies that slot's rows first. Prompts admitted together that share a
prefix none of them holds (one system prompt) forward it once (`MIN_SHARED_PREFIX` tokens at least). Copies are
bit-exact, so none of this changes a result.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from thermik.inference.embedded.records import SampleRecorder
from thermik.inference.embedded.requests import Counters, Request, common_prefix
from thermik.inference.embedded.scheduler import SlotScheduler
from thermik.inference.native_model import NativeCausalLM

MIN_SHARED_PREFIX = 16  # tokens: a shorter prefix shared by admitted prompts is not worth a forward of its own
Row = tuple[int, int, list[int]]  # (slot, cached positions, new tokens) of one prefill row


class PrefillPlanner:
    """Places admitted requests, forwards their uncached prompt tokens, and samples their first tokens."""

    def __init__(
        self,
        native: NativeCausalLM,
        scheduler: SlotScheduler,
        records: SampleRecorder,
        counters: Counters,
        pad_token_id: int,
        reuse_prefixes: bool,
    ) -> None:
        """`reuse_prefixes` False: every request prefills its whole prompt (for benchmarks)."""
        self.native = native
        self.scheduler = scheduler
        self.records = records
        self.counters = counters
        self.pad_token_id = pad_token_id
        self.reuse_prefixes = reuse_prefixes

    def admit(self, requests: list[Request], requeue: Callable[[list[Request]], None]) -> None:
        """Place `requests` (in order; those no slot is free for go back with `requeue`), prefill them and sample
        each one's first token."""
        scheduler = self.scheduler
        scheduler.make_room(max(len(r.prompt_ids) + 1 for r in requests), scheduler.running(), requests)
        taken: set[int] = set()
        leaders: dict[tuple[int, ...], int] = {}  # prompt -> slot prefilling it this round
        prefill: list[tuple[int, int]] = []  # (slot, cached tokens already valid in it)
        followers: list[tuple[int, int]] = []  # (slot, leader slot)
        for n, req in enumerate(requests):
            index = scheduler.place(req, taken)
            if index is None:  # every slot is busy: back to the queue
                requeue(requests[n:])
                break
            taken.add(index)
            slot = scheduler.slots[index]
            slot.request, slot.session_id = req, req.session_id
            key = tuple(req.prompt_ids) if self.reuse_prefixes else (n,)
            if key in leaders:
                followers.append((index, leaders[key]))
                continue
            leaders[key] = index
            slot.tokens = req.prompt_ids[: self._reuse(index, req.prompt_ids, taken)]
            prefill.append((index, len(slot.tokens)))
        if not prefill:
            return
        logits = self._prefill(self._prefill_shared_prefix(prefill))
        rows = {index: logits[r] for r, (index, _) in enumerate(prefill)}
        copies: dict[int, list[int]] = {}  # leader slot -> its followers' slots
        for index, leader in followers:
            copies.setdefault(leader, []).append(index)
            rows[index] = rows[leader]
        for leader, indices in copies.items():
            scheduler.cache.copy_slot(leader, indices, len(scheduler.slots[leader].tokens))
            for index in indices:
                scheduler.slots[index].tokens = list(scheduler.slots[leader].tokens)
        order = sorted(rows)
        self.records.record([scheduler.slots[i] for i in order], torch.stack([rows[i] for i in order]))

    def recompute(self) -> None:
        """Forward again every running request's cached tokens (prompt and sampled so far) from position 0, so
        their keys and values come from the current weights (in-flight weight updates, `inflight_kv="recompute"`).
        The logits are not used: each request's next token was sampled already."""
        slots = self.scheduler.slots
        rows = [(i, 0, slots[i].tokens) for i in self.scheduler.running() if slots[i].tokens]
        if not rows:
            return
        for i, _, _ in rows:
            slots[i].tokens = []
        for group in self.groups(rows):
            self.forward(group)

    def _reuse(self, index: int, prompt: list[int], taken: set[int]) -> int:
        """The positions of `prompt` slot `index` holds once it reuses what it can: its own cached prefix, or a
        longer one copied from another slot (a donor)."""
        if not self.reuse_prefixes:
            return 0
        cached = min(common_prefix(self.scheduler.slots[index].tokens, prompt), len(prompt) - 1)
        donor, shared = self._best_donor(prompt, exclude=taken)
        if shared > cached:
            self.scheduler.cache.copy_slot(donor, index, shared)
            cached = shared
        return cached

    def _best_donor(self, prompt: list[int], exclude: set[int]) -> tuple[int, int]:
        best, shared = -1, 0
        for i, slot in enumerate(self.scheduler.slots):
            if i in exclude or not slot.tokens:
                continue
            n = common_prefix(slot.tokens, prompt)
            if n > shared:
                best, shared = i, n
        return best, min(shared, len(prompt) - 1)

    def _prefill_shared_prefix(self, prefill: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Prompts admitted together that share a prefix none of them holds (a step's prompts under one system
        prompt, after a weight update dropped the cached ones) forward it once, in the first of them, and copy it
        to the others; returns `prefill` (slot, cached positions) with their cached positions moved past it.

        The prefix is the one the rows share with the first prompt lacking at least MIN_SHARED_PREFIX of its
        tokens; a row joins when that gains it as many. Copies are bit-exact, so results do not change."""
        if not self.reuse_prefixes:
            return prefill
        slots = self.scheduler.slots
        prompts = {i: slots[i].request.prompt_ids for i, _ in prefill}
        first = next((prompts[i] for i, cached in prefill if len(prompts[i]) - 1 - cached >= MIN_SHARED_PREFIX), None)
        if first is None:
            return prefill
        reach = {i: min(common_prefix(first, prompts[i]), len(prompts[i]) - 1) for i, _ in prefill}
        members = {i for i, cached in prefill if reach[i] - cached >= MIN_SHARED_PREFIX}
        shared = min((reach[i] for i in members), default=0)
        lacking = [(i, cached) for i, cached in prefill if i in members and cached < shared]
        if len(lacking) < 2:
            return prefill
        anchor, cached = lacking[0]
        self.forward([(anchor, cached, prompts[anchor][cached:shared])])
        others = [i for i, _ in lacking[1:]]
        self.scheduler.cache.copy_slot(anchor, others, shared)
        for i in others:
            slots[i].tokens = prompts[i][:shared]
        return [(i, max(cached, shared) if i in members else cached) for i, cached in prefill]

    def _prefill(self, prefill: list[tuple[int, int]]) -> torch.Tensor:
        """Forward the uncached prompt tokens of every admitted leader; logits at each prompt's end."""
        slots = self.scheduler.slots
        rows = [(i, cached, slots[i].request.prompt_ids[cached:]) for i, cached in prefill]
        logits = torch.cat([self.forward(group) for group in self.groups(rows)])
        self.counters.batches += 1
        return logits

    def groups(self, rows: list[Row]) -> list[list[Row]]:
        """All rows in one padded forward, unless its span (the longest cached prefix + the widest new part)
        would outgrow the cache budget: then consecutive groups whose spans fit (a row alone always fits)."""
        groups: list[list[Row]] = [[]]
        start = width = 0
        for row in rows:
            grown = max(start, row[1]), max(width, len(row[2]))
            if groups[-1] and not self.scheduler.cache.fits(len(self.scheduler.slots), sum(grown) + 1):
                groups.append([])
                grown = row[1], len(row[2])
            groups[-1].append(row)
            start, width = grown
        return groups

    def forward(self, rows: list[Row]) -> torch.Tensor:
        """One padded forward over `rows` (slot, cached positions, new tokens)."""
        width = max(len(new) for _, _, new in rows)
        tokens = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        for r, (_, _, new) in enumerate(rows):
            tokens[r, : len(new)] = torch.tensor(new)
        starts = torch.tensor([cached for _, cached, _ in rows])
        last = torch.tensor([len(new) - 1 for _, _, new in rows])
        cache, slots = self.scheduler.cache, self.scheduler.slots
        cache.ensure(len(slots), int((starts + width).max()) + 1)
        logits = self.native.forward(tokens, torch.tensor([i for i, _, _ in rows]), starts, last, cache)
        for index, _, new in rows:
            slots[index].tokens.extend(new)
        self.counters.forwards += 1
        self.counters.prefill_tokens += sum(len(new) for _, _, new in rows)
        return logits

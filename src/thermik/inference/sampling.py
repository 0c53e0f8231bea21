"""Pure sampling functions over a batch of next-token logits [B, V].

Every parameter is either one Python number shared by all rows or a tensor [B] with one value per row,
so requests with different sampling settings can share one decode batch.

Order of the filters follows common serving practice (vLLM): temperature, then top-k, then top-p
(nucleus sampling, Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"), then min-p
(Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM Outputs").
Temperature 0 means greedy: only the argmax survives.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

RowParam = float | int | torch.Tensor


def _column(value: RowParam, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A per-row parameter as a [B, 1] tensor."""
    t = torch.as_tensor(value, dtype=dtype, device=device)
    if t.ndim == 0:
        return t.expand(batch).unsqueeze(-1)
    if t.shape != (batch,):
        raise ValueError(f"per-row sampling parameter has shape {tuple(t.shape)}, expected ({batch},)")
    return t.unsqueeze(-1)


def _any(condition: torch.Tensor | bool) -> bool:
    return bool(condition.any()) if isinstance(condition, torch.Tensor) else bool(condition)


def _validate(temperature: RowParam, top_k: RowParam, top_p: RowParam, min_p: RowParam) -> None:
    """Per-row tensors or plain numbers."""
    if _any(temperature < 0):
        raise ValueError("temperature must be >= 0")
    if _any(top_k < 0):
        raise ValueError("top_k must be >= 0 (0 disables it)")
    if _any(top_p <= 0) or _any(top_p > 1):
        raise ValueError("top_p must be in (0, 1]")
    if _any(min_p < 0) or _any(min_p > 1):
        raise ValueError("min_p must be in [0, 1]")


def _plain_temperature(temperature: RowParam, top_k: RowParam, top_p: RowParam, min_p: RowParam, vocab: int) -> bool:
    """True when every row shares one temperature > 0 and no filter is on (checked without building tensors)."""
    knobs = (temperature, top_k, top_p, min_p)
    if not all(isinstance(v, int | float) for v in knobs):
        return False
    _validate(*knobs)
    return temperature > 0 and (top_k == 0 or top_k >= vocab) and top_p == 1 and min_p == 0


def process_logits(
    logits: torch.Tensor,
    temperature: RowParam = 1.0,
    top_k: RowParam = 0,
    top_p: RowParam = 1.0,
    min_p: RowParam = 0.0,
) -> torch.Tensor:
    """Scale by temperature and set filtered-out tokens to -inf. Returns a new float32 tensor [B, V].

    top_k = 0 and top_p = 1 and min_p = 0 disable the respective filter.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    batch, vocab = logits.shape
    if _plain_temperature(temperature, top_k, top_p, min_p, vocab):  # the common case: one scale, no filter
        return logits.float() / float(temperature)
    dev = logits.device
    temp = _column(temperature, batch, torch.float32, dev)
    k = _column(top_k, batch, torch.long, dev)
    p = _column(top_p, batch, torch.float32, dev)
    mp = _column(min_p, batch, torch.float32, dev)
    _validate(temp, k, p, mp)

    greedy = temp == 0
    out = logits.float() / torch.where(greedy, torch.ones_like(temp), temp)
    neg_inf = torch.tensor(float("-inf"), device=dev)

    use_k = (k > 0) & (k < vocab)
    use_p = p < 1
    if bool(use_k.any() | use_p.any()):
        sorted_logits, order = out.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=dev).unsqueeze(0)
        # top-k: drop every token ranked k or later.
        drop_sorted = use_k & (rank >= k)
        sorted_logits = sorted_logits.masked_fill(drop_sorted, neg_inf)
        # top-p: keep the smallest prefix whose mass reaches p; the top token is always kept.
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = drop_sorted | (use_p & (mass_before >= p) & (rank > 0))
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, neg_inf)

    use_min_p = mp > 0
    if bool(use_min_p.any()):
        probs = out.softmax(dim=-1)
        threshold = mp * probs.amax(dim=-1, keepdim=True)
        out = out.masked_fill(use_min_p & (probs < threshold), neg_inf)

    if bool(greedy.any()):
        best = logits.argmax(dim=-1, keepdim=True)
        only_best = torch.full_like(out, float("-inf")).scatter(-1, best, 0.0)
        out = torch.where(greedy, only_best, out)
    return out


def _exponential_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Fill `out` with Exp(1) draws as -log(U), U ~ Uniform[0, 1): 5x faster than `Tensor.exponential_` on CPU."""
    return out.uniform_(generator=generator).log_().neg_()


def sample(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    row_generators: Sequence[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """Draw one token id per row from softmax(logits) (logits as returned by `process_logits`). Returns [B] long.

    Uses the exponential race (argmax of p / E with E ~ Exp(1) is a categorical draw), so each row consumes a
    fixed block of V noise values. A row given its own generator in `row_generators` therefore draws the same
    token whatever the other rows are; the other rows draw from `generator` (the global RNG when None).
    """
    batch, vocab = logits.shape
    probs = logits.float().softmax(dim=-1)
    if row_generators is not None and len(row_generators) != batch:
        raise ValueError(f"got {len(row_generators)} row generators for {batch} rows")
    noise = torch.empty_like(probs)
    if row_generators is None or all(g is None for g in row_generators):
        _exponential_(noise, generator)
    else:
        shared = [i for i, g in enumerate(row_generators) if g is None]
        if shared:
            noise[shared] = _exponential_(torch.empty(len(shared), vocab, device=probs.device), generator)
        for i, g in enumerate(row_generators):
            if g is not None:
                _exponential_(noise[i], g)
    # E can be exactly 0 in float32; a tiny floor keeps p = 0 tokens at 0 instead of 0 / 0.
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: RowParam = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token] per row, before any top-k/top-p/min-p filter. Returns [B] float32.

    Greedy rows (temperature 0) use temperature 1, so their logprobs are the model's own distribution.
    """
    batch = logits.shape[0]
    temp = _column(temperature, batch, torch.float32, logits.device)
    temp = torch.where(temp == 0, torch.ones_like(temp), temp)
    logp = (logits.float() / temp).log_softmax(dim=-1)
    return logp.gather(-1, token_ids.view(batch, 1)).squeeze(-1)

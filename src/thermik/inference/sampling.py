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

from thermik.cpu.kernels import MAX_SAMPLE_VOCAB, vocab_kernels_for

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
        out = logits.to(torch.float32, copy=True)
        return out if float(temperature) == 1.0 else out.div_(float(temperature))
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


# Tokens per block of the two-level inverse CDF: block sums are one vectorized reduction, and only the chosen
# block's prefix sums are ever formed (sqrt(V)-ish keeps both levels small for vocabularies of 30k-150k).
_BLOCK = 256


def _uniforms(
    batch: int,
    device: torch.device,
    generator: torch.Generator | None,
    row_generators: Sequence[torch.Generator | None] | None,
) -> torch.Tensor:
    """One float64 U ~ Uniform[0, 1) per row: a row with its own generator consumes exactly one draw from it."""
    if row_generators is not None and len(row_generators) != batch:
        raise ValueError(f"got {len(row_generators)} row generators for {batch} rows")
    if row_generators is None or all(g is None for g in row_generators):
        return torch.rand(batch, generator=generator, dtype=torch.float64, device=device)
    u = torch.empty(batch, dtype=torch.float64, device=device)
    shared = [i for i, g in enumerate(row_generators) if g is None]
    if shared:
        u[shared] = torch.rand(len(shared), generator=generator, dtype=torch.float64, device=device)
    for i, g in enumerate(row_generators):
        if g is not None:
            u[i : i + 1] = torch.rand(1, generator=g, dtype=torch.float64, device=device)
    return u


def _pick(upper: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Index i with upper[i - 1] <= x < upper[i] per row (upper: [B, n] prefix sums, x: [B, 1] < upper[:, -1]).

    The chosen interval has positive width, so zero-mass entries are never chosen.
    """
    return torch.searchsorted(upper, x, right=True)


def _below(top: torch.Tensor) -> torch.Tensor:
    """The largest float64 below `top`, to keep u * total < total when the product rounds up."""
    return torch.nextafter(top, torch.zeros_like(top))


def sample(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    row_generators: Sequence[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """Draw one token id per row from softmax(logits) (logits as returned by `process_logits`). Returns [B] long.

    Inverse-CDF sampling with one float64 uniform per row (the exponential race draws V random numbers per row
    and is several times slower: benchmarks/README.md, `sampling_speed.py`). Two levels keep it cheap
    and exact to the softmax's own float32 precision: float64 prefix sums of the `_BLOCK`-token block masses
    (float32 sums) pick a block, then float64 prefix sums inside that block pick the token, with the remainder
    rescaled to the block's float64 mass. A row given its own generator in `row_generators` draws
    exactly one number from it, so it gets the same token whatever the other rows are; the other rows draw from
    `generator` (the global RNG when None).
    """
    batch, vocab = logits.shape
    probs = logits.float().softmax(dim=-1)
    u = _uniforms(batch, probs.device, generator, row_generators)
    full = vocab // _BLOCK
    masses = [probs[:, : full * _BLOCK].view(batch, full, _BLOCK).sum(-1)]
    if vocab % _BLOCK:
        masses.append(probs[:, full * _BLOCK :].sum(-1, keepdim=True))
    upper = torch.cat(masses, dim=-1).cumsum(-1, dtype=torch.float64)  # [B, blocks]
    x = torch.minimum(u.unsqueeze(-1) * upper[:, -1:], _below(upper[:, -1:]))
    block = _pick(upper, x)
    hi = upper.gather(-1, block)
    lo = torch.where(block > 0, upper.gather(-1, (block - 1).clamp_min(0)), 0.0)
    cols = block * _BLOCK + torch.arange(_BLOCK, device=probs.device)
    inside = probs.gather(-1, cols.clamp_max(vocab - 1)).double().masked_fill_(cols >= vocab, 0.0)
    inner = inside.cumsum(-1)
    mass = inner[:, -1:]
    r = torch.minimum((x - lo) / (hi - lo) * mass, _below(mass))
    return cols.gather(-1, _pick(inner, r)).squeeze(-1)


def fused_sample(
    logits: torch.Tensor,
    temperature: RowParam,
    top_k: RowParam,
    top_p: RowParam,
    min_p: RowParam,
    generator: torch.Generator | None = None,
    row_generators: Sequence[torch.Generator | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(token ids [B], their logprobs [B]) in one C pass per row (`cpu/csrc/vocab.c`): `sample`'s two-level
    inverse CDF and `token_logprobs`, with the same uniforms drawn the same way, read from the logits in place.
    For the plain setting only (one temperature > 0 for every row, no filter) on CPU; None otherwise, and the
    caller runs `process_logits`, `sample` and `token_logprobs`."""
    if logits.ndim != 2 or logits.shape[-1] > MAX_SAMPLE_VOCAB:
        return None
    if not _plain_temperature(temperature, top_k, top_p, min_p, logits.shape[-1]):
        return None
    kernels = vocab_kernels_for(logits)
    if kernels is None:
        return None
    u = _uniforms(logits.shape[0], logits.device, generator, row_generators)
    return kernels.sample(logits, 1.0 / float(temperature), u)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: RowParam = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token] per row, before any top-k/top-p/min-p filter. Returns [B] float32.

    Greedy rows (temperature 0) use temperature 1, so their logprobs are the model's own distribution. On CPU with one
    temperature for every row, the vocabulary kernel reads the logits in place (no float32 [B, V] copy; the same
    float32 arithmetic, `cpu/csrc/vocab.c`)."""
    batch = logits.shape[0]
    temp = _column(temperature, batch, torch.float32, logits.device)
    temp = torch.where(temp == 0, torch.ones_like(temp), temp)
    kernels = vocab_kernels_for(logits)
    if kernels is not None and bool((temp == temp[0]).all()):
        out = tuple(torch.empty(1, batch) for _ in range(3))
        kernels.forward(logits[None], token_ids.view(1, batch).contiguous(), 1.0 / float(temp[0]), out)
        return out[0][0]
    logp = (logits.float() / temp).log_softmax(dim=-1)
    return logp.gather(-1, token_ids.view(batch, 1)).squeeze(-1)

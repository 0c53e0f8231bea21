"""Training forward that runs each group's shared prompt once.

The n samples of a GRPO group share their prompt, which in agent RL is often longer than the sampled part
(system prompt, tool schemas, task). A plain forward pays for that prompt n times, forward and backward. This
forward runs each distinct prompt of a micro-batch once, then runs every row's own tokens (its response: the
sampled turns and the observations between them) attending to its prompt's keys and values, which are shared by
gather, so their gradients add up over the group exactly as in n separate forwards. The logprobs and entropies
it returns equal `batch.token_logprobs` on every response position (to float rounding; tested, values and
gradients); prompt positions, which carry no loss, are 0.

It calls the HF model's own submodules (projections, MLP, rotary embedding), so PEFT adapters on them apply, and
runs its RMSNorms, RoPE and the MLP's SwiGLU gate as fused ops (`training/fused_ops.py`); only the attention wiring
is ours. Qwen2/Qwen3/Llama-shaped models only (the same family as the engine's
native forward); `token_logprobs_shared` falls back to the plain forward for anything else, and when no two rows
of the micro-batch share a prompt.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from transformers import PreTrainedModel

from thermik.models.architecture import unsupported_reason, unwrapped
from thermik.training.batch import effective_temperature, logprobs_and_entropy
from thermik.training.fused_head import embed, head_logprobs
from thermik.training.fused_ops import gated_mlp, rms_norm_to, rope_heads_first

# The packed response rows are padded to a multiple of this: oneDNN's bfloat16 products run markedly slower on
# other row counts.
ROW_MULTIPLE = 16


@dataclass
class PrefixPlan:
    """Which rows share which prompt: `group_of_row` [B] indexes `prompt_lens` [G] and `first_row` [G]."""

    group_of_row: Tensor
    first_row: Tensor
    prompt_lens: Tensor
    row_prompt_lens: Tensor  # [B]
    row_lens: Tensor  # [B] real tokens per row

    @property
    def num_groups(self) -> int:
        return int(self.first_row.numel())


def plan_prefixes(input_ids: Tensor, attention_mask: Tensor, prompt_lens: Tensor) -> PrefixPlan | None:
    """Group rows by identical prompt; None when no prompt is shared (or a row has no response token)."""
    row_lens = attention_mask.sum(1)
    if bool((prompt_lens < 1).any() | (prompt_lens >= row_lens).any()):
        return None
    index: dict[tuple[int, ...], int] = {}
    group_of_row, first_row = [], []
    for i, p in enumerate(prompt_lens.tolist()):
        key = tuple(input_ids[i, :p].tolist())
        if key not in index:
            index[key] = len(index)
            first_row.append(i)
        group_of_row.append(index[key])
    if len(index) == len(group_of_row):
        return None
    device = input_ids.device
    first = torch.tensor(first_row, device=device)
    return PrefixPlan(torch.tensor(group_of_row, device=device), first, prompt_lens[first], prompt_lens, row_lens)


def supports_shared_prefix(model: torch.nn.Module) -> bool:
    """A plain (or PEFT-wrapped) supported HF model. Wrappers with forward hooks of their own (DDP, FSDP2, the Ray
    workers' gradient scaling) must run their own forward, so they get the plain one."""
    base = unwrapped(model)
    if not isinstance(base, PreTrainedModel) or isinstance(base, FSDPModule):
        return False
    return unsupported_reason(base) is None and not (model.training and base.config.attention_dropout)


def token_logprobs_shared(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = True,
    only: Tensor | None = None,
) -> tuple[Tensor, Tensor] | None:
    """(logp [B, L-1], entropy [B, L-1]) like `batch.token_logprobs`, prompts computed once per group; None when
    this forward does not apply (the caller then runs the plain one). only [B, L-1]: compute the lm head and the
    vocabulary work at the positions where it is nonzero (the trained tokens), 0 elsewhere: a batch padded to its
    longest response, with tool results inside, has several times more positions than trained tokens, and the lm
    head is the largest product of a small model."""
    if not supports_shared_prefix(model):
        return None
    plan = plan_prefixes(input_ids, attention_mask, prompt_lens)
    if plan is None:
        return None
    lm = unwrapped(model)
    prompt_hidden, response_hidden, response_ids = _forward(lm, input_ids, plan)
    groups = torch.arange(plan.num_groups, device=input_ids.device)
    last = prompt_hidden[groups, plan.prompt_lens - 1]  # predicts each response's 1st token
    hidden = torch.cat([last[plan.group_of_row, None], response_hidden[:, :-1]], dim=1)  # [B, S, H]
    # Response position j of row i is next-token position prompt_len_i - 1 + j of the plain layout.
    width = input_ids.shape[1] - 1
    span = response_ids.shape[1]
    cols = plan.row_prompt_lens[:, None] - 1 + torch.arange(span, device=input_ids.device)[None]
    if only is not None:
        keep = (cols < width) & (only.gather(1, cols.clamp(max=width - 1)) != 0)
        rows, at = keep.nonzero(as_tuple=True)
        logp, entropy = _head_logprobs(lm, hidden[rows, at], response_ids[rows, at], temperature, entropy_grad)
        where = (rows, cols[rows, at])
        return tuple(x.new_zeros(len(cols), width).index_put(where, x) for x in (logp, entropy))
    logits = lm.lm_head(lm.model.norm(hidden))
    logp, entropy = logprobs_and_entropy(logits, response_ids, temperature, entropy_grad)
    return _place(logp, cols, width), _place(entropy, cols, width)


def _head_logprobs(
    lm: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float, entropy_grad: bool
) -> tuple[Tensor, Tensor]:
    """(logp [K], entropy [K]) of `targets` [K] after the final norm and the lm head on hidden [K, H]: fused
    (`fused_head.head_logprobs`) where the head allows it."""
    x = rms_norm_to(hidden, lm.model.norm, hidden.dtype)
    fused = head_logprobs(lm.lm_head, x, targets, 1.0 / effective_temperature(temperature))
    if fused is not None:
        return fused[0], fused[1] if entropy_grad else fused[1].detach()
    logp, entropy = logprobs_and_entropy(lm.lm_head(x)[None], targets[None], temperature, entropy_grad)
    return logp[0], entropy[0]


def _place(values: Tensor, cols: Tensor, width: int) -> Tensor:
    """Scatter [B, S] values to columns `cols` of a [B, width] zero tensor (differentiable). Columns past a row's
    last token land on its padding (or past `width`, cut off)."""
    out = values.new_zeros(values.shape[0], width + values.shape[1])
    return out.scatter(1, cols, values)[:, :width]


def _forward(lm: torch.nn.Module, input_ids: Tensor, plan: PrefixPlan) -> tuple[Tensor, Tensor, Tensor]:
    """(prompt hidden [G, P, H], response hidden [B, S, H], response ids [B, S]) before the final norm.

    The responses run packed, [N, H] for their N real tokens: a group's responses differ in length by several
    times, and padding them to the longest one would compute far more tokens than are trained. Each row's
    attention runs on its own queries, over its prompt's keys and, causally, its own (`_attend`)."""
    inner, cfg = lm.model, lm.config
    num_heads, num_kv = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
    batch = input_ids.shape[0]
    prompt_width = int(plan.prompt_lens.max())
    response_lens = plan.row_lens - plan.row_prompt_lens
    span = int(response_lens.max())
    prompt_ids = input_ids[plan.first_row, :prompt_width]  # tokens past a prompt's end are never attended to
    device = input_ids.device
    offsets = torch.arange(span, device=device)[None]
    gather_at = (plan.row_prompt_lens[:, None] + offsets).clamp(max=input_ids.shape[1] - 1)
    response_ids = input_ids.gather(1, gather_at)
    real = (offsets < response_lens[:, None]).flatten().nonzero().squeeze(1)  # [N] into the flattened [B, S]
    # One lookup for both: the embedding's backward builds a dense [vocab, hidden] gradient per call.
    x_p, x_r = embed(inner.embed_tokens, torch.cat([prompt_ids.flatten(), response_ids.flatten()[real]])).split(
        [prompt_ids.numel(), len(real)]
    )
    x_p = x_p.view(*prompt_ids.shape, -1)
    rope_p = inner.rotary_emb(x_p, torch.arange(prompt_width, device=device)[None].expand(plan.num_groups, -1))
    pad = -len(real) % ROW_MULTIPLE  # zero rows after the packed tokens: never attended to, no loss, no gradient
    x_r = F.pad(x_r, (0, 0, 0, pad))
    positions_r = F.pad((plan.row_prompt_lens[:, None] + offsets).flatten()[real], (0, pad))
    rope_r = inner.rotary_emb(x_r[None], positions_r[None])

    # Row i's response tokens are packed rows starts[i] .. starts[i] + lens[i]: they see its prompt, then causally.
    lens = response_lens.tolist()
    starts = [0, *itertools.accumulate(lens)][:-1]
    groups, prompt_lens = plan.group_of_row.tolist(), plan.row_prompt_lens.tolist()
    dtype, group = _compute_dtype(x_r), num_heads // num_kv
    biases, causal = _mask_biases(prompt_lens, lens, prompt_width, group, dtype, device)
    shape = (num_heads, num_kv, head_dim)
    for layer in inner.layers:
        attn = layer.self_attn
        q_p, k_p, v_p = _qkv(attn, rms_norm_to(x_p, layer.input_layernorm, dtype), rope_p, shape, dtype)
        q_r, k_r, v_r = _qkv(attn, rms_norm_to(x_r, layer.input_layernorm, dtype)[None], rope_r, shape, dtype)
        a_p = _attend_prompts(q_p, k_p, v_p, causal)
        a_r = torch.cat([
            _attend(
                q_r[:, :, s : s + n],
                torch.cat([k_p[g : g + 1, :, :p], k_r[:, :, s : s + n]], dim=2),
                torch.cat([v_p[g : g + 1, :, :p], v_r[:, :, s : s + n]], dim=2),
                biases[p, n],
            )
            for s, n, g, p in zip(starts, lens, groups, prompt_lens, strict=True)
        ] + [q_r.new_zeros(1, num_heads, pad, head_dim)], dim=2)  # fmt: skip
        x_p = x_p + attn.o_proj(a_p.transpose(1, 2).flatten(2))
        x_r = x_r + attn.o_proj(a_r[0].transpose(0, 1).flatten(1))
        x_p = x_p + gated_mlp(layer.mlp, rms_norm_to(x_p, layer.post_attention_layernorm, dtype))
        x_r = x_r + gated_mlp(layer.mlp, rms_norm_to(x_r, layer.post_attention_layernorm, dtype))
    response_hidden = x_r.new_zeros(batch * span, x_r.shape[-1]).index_copy(0, real, x_r[: len(real)])
    return x_p, response_hidden.view(batch, span, -1), response_ids


def _mask_biases(
    prompt_lens: list[int], lens: list[int], prompt_width: int, group: int, dtype: torch.dtype, device: torch.device
) -> tuple[dict[tuple[int, int], Tensor], Tensor]:
    """The additive masks of `_forward`: per (prompt length, response length) a response sees its whole prompt, then
    itself causally; the prompts see themselves causally."""
    biases = {}
    for p, n in set(zip(prompt_lens, lens, strict=True)):
        visible = torch.ones(n, p + n, dtype=torch.bool, device=device)
        biases[p, n] = _mask_bias(visible.tril_(p), group, dtype)
    causal = _mask_bias(torch.ones(prompt_width, prompt_width, dtype=torch.bool, device=device).tril(), group, dtype)
    return biases, causal


def _attend_prompts(q: Tensor, k: Tensor, v: Tensor, causal: Tensor) -> Tensor:
    """Causal attention of the prompts: the flash kernel in float32, `_attend` in bfloat16, where the flash kernel's
    backward is slower on CPU than two matmuls and a softmax; in float32 the flash kernel is the faster."""
    if q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
    return _attend(q, k, v, causal)


def _mask_bias(visible: Tensor, group: int, dtype: torch.dtype) -> Tensor:
    """The additive mask [group * n, L] (0 where visible [n, L], else -inf) of one KV head's `group` query heads."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return bias.masked_fill_(~visible, float("-inf")).repeat(group, 1)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """Attention of queries q [B, H, n, D] over keys and values [B, KV, L, D] under the additive mask `bias` [H/KV *
    n, L] (`_mask_bias`), as two matmuls and a float32 softmax: each KV head's query group is one product (no
    repeated keys), and the mask is added by the first product (no masking pass, forward or backward). In bfloat16
    this beats the flash kernel with a mask, which computes the masked blocks too."""
    batch, heads, n, dim = q.shape
    kv, width = k.shape[1], k.shape[2]
    group = heads // kv
    scores = torch.baddbmm(
        bias.expand(batch * kv, -1, -1),
        q.reshape(batch * kv, group * n, dim) * dim**-0.5,
        k.reshape(batch * kv, width, dim).transpose(-1, -2),
    )
    probs = torch.softmax(scores, -1, dtype=torch.float32).to(v.dtype).view(batch, kv, group * n, width)
    return (probs @ v).view(batch, heads, n, dim)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the products run in: autocast's, else x's. A norm's output cast to it once spares each projection
    that reads it (q, k, v; gate, up) its own autocast cast of the same tensor, and the rotated queries and keys
    cast once spare each row's attention products theirs: the values are those autocast would cast."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _qkv(
    attn: torch.nn.Module,
    h: Tensor,
    rope: tuple[Tensor, Tensor],
    shape: tuple[int, int, int],
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, keys, values [N, heads, T, head_dim] with the model's q/k norms (Qwen3) and RoPE applied (in the
    rotary tables' precision, then cast to `dtype`)."""
    num_heads, num_kv, head_dim = shape
    n, t = h.shape[:2]
    q = attn.q_proj(h).view(n, t, num_heads, head_dim)
    k = attn.k_proj(h).view(n, t, num_kv, head_dim)
    v = attn.v_proj(h).view(n, t, num_kv, head_dim).transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = rope
    return rope_heads_first(q, cos, sin, dtype), rope_heads_first(k, cos, sin, dtype), v

"""Collate trajectories into padded tensors aligned with next-token targets.

Every per-token tensor is indexed like `input_ids[:, 1:]`: position t holds the quantity of the
token at t+1 (its logprob, mask, advantage), which is what a causal LM's logits at t predict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thermik.algorithms.advantages import broadcast_to_tokens
from thermik.rollout.trajectory import Trajectory
from thermik.training.chunked_head import token_logprobs_chunked
from thermik.training.vocab_logprobs import vocab_logprobs


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, L] right-padded
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1] float, 1 on sampled tokens that are trained
    rollout_logp: torch.Tensor  # [B, L-1]
    adv: torch.Tensor  # [B, L-1]
    old_logp: torch.Tensor | None = None  # [B, L-1] behaviour-policy logprobs when more than one optimizer step
    ref_logp: torch.Tensor | None = None  # [B, L-1] frozen reference logprobs when KL is on
    token_rewards: torch.Tensor | None = None  # [B, L-1] each turn's reward on its last sampled token
    group_ids: torch.Tensor | None = None  # [B] the prompt (group) of each row
    values: torch.Tensor | None = None  # [B, L-1] critic values before the update (advantage gae)
    returns: torch.Tensor | None = None  # [B, L-1] GAE returns, the critic's regression targets
    prompt_lens: torch.Tensor | None = None  # [B] prompt tokens of each row (rows of a group share them)
    episode_ids: torch.Tensor | None = None  # [B] the episode of each row (an episode's step-wise samples share it)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, end: int) -> TokenBatch:
        return TokenBatch(*(None if t is None else t[start:end] for t in self.__dict__.values()))

    def to(self, device: torch.device | str) -> TokenBatch:
        """The batch with every tensor on `device` (the model's). Batches are collated on the CPU: rewards,
        advantages and their shaping run there, the forward and the loss where the model lives."""
        return TokenBatch(*(None if t is None else t.to(device) for t in self.__dict__.values()))

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum().item())


def collate(trajs: list[Trajectory], seq_adv: torch.Tensor | None, pad_id: int) -> TokenBatch:
    """One row per training sample: each episode's samples (`Trajectory.samples`, rollout.step_wise) in order, with
    the episode's group id and its index in `trajs` as episode id. seq_adv [len(trajs)]: one advantage per episode,
    broadcast to its sampled tokens; None leaves adv at 0 for `training/batch_advantages.assign_advantages` to fill. No
    trajectories give a batch of no rows (a step with nothing to train: its update is skipped)."""
    rows = [(e, s) for e, t in enumerate(trajs) for s in t.samples]
    lengths = [len(s.prompt_ids) + len(s.response_ids) for _, s in rows]
    b, width = len(rows), max(lengths, default=1)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width - 1))
    rollout_logp = torch.zeros((b, width - 1))
    token_rewards = torch.zeros((b, width - 1))
    for i, (_, t) in enumerate(rows):
        seq = t.prompt_ids + t.response_ids
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        p, r = len(t.prompt_ids), len(t.response_ids)
        mask[i, p - 1 : p - 1 + r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        rollout_logp[i, p - 1 : p - 1 + r] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
        if t.rewards:
            token_rewards[i, p - 1 : p - 1 + r] = torch.tensor(t.rewards, dtype=torch.float32)
    episode_ids = torch.tensor([e for e, _ in rows], dtype=torch.long)
    adv = torch.zeros_like(mask)
    if seq_adv is not None:
        adv = broadcast_to_tokens(seq_adv.to(torch.float32)[episode_ids], mask)
    return TokenBatch(
        input_ids,
        attention,
        mask,
        rollout_logp,
        adv,
        token_rewards=token_rewards,
        group_ids=torch.tensor([trajs[e].group_id for e, _ in rows], dtype=torch.long),
        prompt_lens=torch.tensor([len(s.prompt_ids) for _, s in rows], dtype=torch.long),
        episode_ids=episode_ids,
    )


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters live (where its inputs must go)."""
    return next(model.parameters()).device


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp of `targets` [B, T], entropy [B, T]) under softmax(logits[:, :T] / temperature), in float32 (logits
    [B, L, V], L >= T, any float dtype). entropy_grad=False detaches the entropy: with no entropy bonus it is only a
    metric, and its gradient over the vocabulary would cost a real model's step time."""
    logp, entropy = vocab_logprobs(logits, targets, effective_temperature(temperature))
    return logp, entropy if entropy_grad else entropy.detach()


def effective_temperature(temperature: float) -> float:
    """The temperature the logprobs are taken at: a greedy sampler's 0 counts as 1."""
    return temperature if temperature not in (0.0, 1.0) else 1.0


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp [B, L-1] of each next token under softmax(logits / temperature), entropy [B, L-1]); through the chunked
    head (training/chunked_head.py) when the full logits would exceed its budget."""
    inv_temp = 1.0 / effective_temperature(temperature)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    chunked = token_logprobs_chunked(model, inv_temp, entropy_grad, **inputs)
    if chunked is not None:
        return chunked
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logprobs_and_entropy(logits, input_ids[:, 1:], temperature, entropy_grad)

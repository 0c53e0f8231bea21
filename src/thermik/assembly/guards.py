"""Consistency guards between the engines and the trainer, in every run mode (local, Ray, split): they stop the run,
naming the guard, before a silent mismatch between the engine and the trainer corrupts training.

- Weight checksum, after every weight sync: each tensor the sync sent and the engine's tensor of that name get an
  exact checksum (the wrapping sum of each element's mixed raw bits, in the engine's dtype). Integer sums are
  order-independent, so fused or strided engine tensors checksum like the trainer's; a changed element changes
  the sum (barring a 2^-32 collision); swapped elements do not. A few integer passes over the weights.
- Logprob parity probe, every k steps: the engine samples a few tokens after a fixed probe prompt; the trainer
  scores the same tokens; the largest absolute logprob difference must stay under a threshold.

A mode says where the weights live with two functions: `WeightCheck` (the mismatching tensors, or None where the
engine's weights cannot be read) and `Scorer` (the trainer's logprobs of a token sequence). Local mode reads the
engine's weights in this process (`local_weight_check`, `policy_scorer`); Ray asks the engine actors and trainer
rank 0 for their checksums and scores (distributed/launch.py); the split orchestrator holds the server's checksums
(GET /weight_checksums) against the weight file the trainer published (`served_weight_check`) and, with no trainer
beside it, runs no parity probe. Engines without readable weights (vLLM) cannot be checksummed: that guard then
warns once and skips.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from thermik.config.schema import GuardsConfig
from thermik.cpu.checksum import checksum
from thermik.inference.base import InferenceEngine, SamplingParams
from thermik.inference.remote import RemoteEngine
from thermik.inference.weights import load_state
from thermik.models.chat import ChatTokenizer
from thermik.training.batch import token_logprobs

PROBE_TEXT = "thermik parity probe: 3 + 4 = 7; reverse 'abc' -> 'cba'."
WeightCheck = Callable[[], Awaitable[tuple[list[str], int] | None]]  # (mismatching tensors, tensors sent) or None
Scorer = Callable[[list[int]], Awaitable[Sequence[float]]]  # the trainer's logprob of each next token of the ids


class ConsistencyError(RuntimeError):
    """The engine and the trainer disagree; the message names the guard."""


def weight_mismatches(sent: Mapping[str, torch.Tensor], held: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors the engine does not hold as sent (each compared in the engine tensor's dtype)."""
    bad = []
    for name, tensor in sent.items():
        mine = held.get(name)
        if mine is None:
            bad.append(f"{name} (absent in the engine)")
        elif checksum(tensor.to(device=mine.device), mine.dtype) != checksum(mine):
            bad.append(name)
    return bad


def engine_state(engine: InferenceEngine) -> Mapping[str, torch.Tensor] | None:
    """The engine's weights by name when they live in this process (embedded, HF engines), else None."""
    model = getattr(engine, "model", None)
    return model.state_dict() if isinstance(model, torch.nn.Module) else None


def local_weight_check(engine: InferenceEngine, sent: Mapping[str, torch.Tensor]) -> WeightCheck:
    """The weight check of an engine in this process against the tensors the sync `sent`."""

    async def check() -> tuple[list[str], int] | None:
        held = engine_state(engine)
        return None if held is None else (weight_mismatches(sent, held), len(sent))

    return check


def served_weight_check(engine: RemoteEngine, weights: Path) -> WeightCheck:
    """The weight check of a split run: the tensors of the trainer's published `weights` (a weight directory: a
    safetensors file or shared memory) against the checksums the inference server reports for the weights it holds
    (None where it cannot report them)."""

    async def check() -> tuple[list[str], int] | None:
        held = await engine.weight_checksums()
        if held is None:
            return None
        sent = await asyncio.to_thread(load_state, weights)
        bad = [
            f"{name} (absent in the engine)" if name not in held else name
            for name, tensor in sent.items()
            if name not in held or checksum(tensor, getattr(torch, held[name][0])) != held[name][1]
        ]
        return bad, len(sent)

    return check


def policy_scorer(policy: torch.nn.Module) -> Scorer:
    """Scores with the policy in this process (evaluation mode, no gradients)."""

    async def score(ids: list[int]) -> list[float]:
        tensor = torch.tensor([ids], device=next(policy.parameters()).device)
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad():
                logp, _ = token_logprobs(policy, tensor, torch.ones_like(tensor), 1.0)
        finally:
            policy.train(was_training)
        return logp[0].double().cpu().tolist()

    return score


async def parity_gap(engine: InferenceEngine, score: Scorer, probe: list[int], tokens: int) -> float:
    """Largest |engine logprob - trainer logprob| over `tokens` tokens the engine samples (seeded) after `probe`."""
    gen = await engine.generate(probe, SamplingParams(max_tokens=tokens, temperature=1.0, seed=0))
    trainer = torch.tensor(list(await score(probe + list(gen.token_ids)))[len(probe) - 1 :], dtype=torch.float64)
    return float((trainer - torch.tensor(gen.logprobs, dtype=torch.float64)).abs().max())


def _parity_cause(engine: InferenceEngine, weights_checked: bool) -> str:
    """What a parity gap over the limit means: with the weight checksum passed, numerics (the engine's precision
    against the trainer's scoring), else possibly weights the engine does not hold."""
    held = engine_state(engine)
    dtype = next(iter(held.values())).dtype if held else None
    computes = f" ({str(dtype).removeprefix('torch.')})" if dtype is not None else ""
    if weights_checked:
        return (
            "the weight checksum guard passed, so the engine holds the trainer's weights and the gap is numerical: "
            f"the engine's precision{computes} against the trainer's scoring of the probe in its weights' dtype (a "
            "bfloat16 engine's gap to float32 on a trained model's tokens reaches 0.2-2, docs/reliability.md); raise "
            "guards.parity_max_abs_diff, or run the engine in float32 (inference.precision)"
        )
    return (
        f"the engine is not running the trainer's weights, or its precision{computes} differs from the trainer's "
        "(the weight checksum guard did not check the weights: guards.weight_checksum)"
    )


class ConsistencyGuards:
    """The guards a weight sync runs; built once per run from `GuardsConfig`."""

    def __init__(self, cfg: GuardsConfig, probe_ids: list[int]) -> None:
        self.cfg, self.probe_ids = cfg, probe_ids
        self._warned: set[str] = set()

    @classmethod
    def for_run(cls, cfg: GuardsConfig, chat: ChatTokenizer) -> ConsistencyGuards:
        """The guards of a run whose policy speaks through `chat` (the probe prompt in its tokens)."""
        return cls(cfg, list(chat.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)))

    async def after_sync(
        self, engine: InferenceEngine, weights: WeightCheck, score: Scorer | None, step: int
    ) -> dict[str, float]:
        """Run the guards due after the sync that ended `step` (0-based); raise ConsistencyError on a mismatch.
        score None: no trainer beside the engine (the split orchestrator), so no parity probe (warned once)."""
        metrics: dict[str, Any] = {}
        checked = False  # the weight checksum guard ran and passed (it raises on a mismatch)
        if self.cfg.weight_checksum:
            t0 = time.perf_counter()
            checked = self._check_weights(engine, await weights())
            metrics["guards/weight_checksum_s"] = time.perf_counter() - t0
        if self.cfg.parity_every and score is None:
            self._warn_once("parity", "guards.parity_every: no trainer model beside this engine; the probe is not run")
        elif self.cfg.parity_every and (step + 1) % self.cfg.parity_every == 0:
            t0 = time.perf_counter()
            gap = await parity_gap(engine, score, self.probe_ids, self.cfg.parity_tokens)
            metrics |= {"guards/parity_max_abs_diff": gap, "guards/parity_s": time.perf_counter() - t0}
            if not gap <= self.cfg.parity_max_abs_diff:  # NaN fails too
                raise ConsistencyError(
                    f"logprob parity probe guard (guards.parity_every): after step {step + 1} the engine and the "
                    f"trainer give the probe's tokens logprobs {gap:.4g} apart (limit guards.parity_max_abs_diff = "
                    f"{self.cfg.parity_max_abs_diff:g}): {_parity_cause(engine, checked)}"
                )
        return metrics

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            warnings.warn(message, RuntimeWarning, stacklevel=4)
            self._warned.add(key)

    def _check_weights(self, engine: InferenceEngine, found: tuple[list[str], int] | None) -> bool:
        """Raise on a mismatch; True where the weights were checked (and match), False where they cannot be read."""
        if found is None:
            self._warn_once(
                "weights", f"guards.weight_checksum: {type(engine).__name__}'s weights cannot be read; not checked"
            )
            return False
        bad, sent = found
        if bad:
            raise ConsistencyError(
                f"weight checksum guard (guards.weight_checksum): after the sync to version {engine.weight_version} "
                f"the engine holds {len(bad)} of {sent} tensors unlike the trainer sent them, first "
                f"{', '.join(bad[:3])}: a stale or corrupted engine weight"
            )
        return True

"""Sampling records: one step's logits become each running request's next token, its logprob (and top logprobs),
the weight version that produced it, and the request's end when a stop condition holds."""

from __future__ import annotations

import torch

from thermik.inference.base import SamplingParams, StopReason
from thermik.inference.embedded.requests import Detokenize, Request, Slot
from thermik.inference.sampling import fused_sample, process_logits, sample, token_logprobs


class SampleRecorder:
    """Samples the next token of every row of a step and records it in the row's request and slot."""

    def __init__(
        self, generator: torch.Generator, detokenize: Detokenize | None, max_positions: int, version: int = 0
    ) -> None:
        """`version`: the weight version stamped on each recorded token; the engine sets it at each weight update."""
        self.generator = generator
        self.detokenize = detokenize
        self.max_positions = max_positions
        self.version = version
        self._tick = 0  # steps recorded: a slot's `last_used`

    def record(self, slots: list[Slot], logits: torch.Tensor) -> None:
        """Sample row r of `logits` for the request running in `slots[r]`; finished requests leave their slot."""
        requests = [slot.request for slot in slots]
        params = [r.sampling for r in requests]
        knobs = {(p.temperature, p.top_k, p.top_p, p.min_p) for p in params}
        if len(knobs) == 1:  # one setting for all rows (the usual decode batch): plain numbers, no per-row tensors
            temperature, top_k, top_p, min_p = knobs.pop()
        else:
            temperature = torch.tensor([p.temperature for p in params])
            top_k, top_p, min_p = (torch.tensor([getattr(p, k) for p in params]) for k in ("top_k", "top_p", "min_p"))
        generators = [r.generator for r in requests]
        fused = fused_sample(logits, temperature, top_k, top_p, min_p, self.generator, generators)
        if fused is None:
            ids = sample(process_logits(logits, temperature, top_k, top_p, min_p), self.generator, generators)
            logp_t = token_logprobs(logits, ids, temperature)
            if logits.is_cuda:  # one copy to the host (one synchronisation) for the step's ids and logprobs
                ids, logp = _to_host(ids, logp_t)
            else:
                logp = logp_t.tolist()
        else:
            ids, logp = fused[0], fused[1].tolist()
        top = _top_logprobs(logits, temperature, params)
        self._tick += 1
        for row, (slot, req, token) in enumerate(zip(slots, requests, ids.tolist(), strict=True)):
            req.token_ids.append(token)
            req.logprobs.append(logp[row])
            req.versions.append(self.version)
            if top is not None and params[row].top_logprobs:
                k = params[row].top_logprobs
                req.top_logprobs.append(dict(zip(top[1][row, :k].tolist(), top[0][row, :k].tolist(), strict=True)))
            reason = self._stop_reason(req, token)
            slot.next_token, slot.last_used = token, self._tick
            if reason is not None:
                req.finish(reason, self.version)
                slot.request = None
            elif req.on_token is not None:
                req.on_token()  # (a finished request notifies through its future)

    def _stop_reason(self, req: Request, token: int) -> StopReason | None:
        if token in req.stop_ids:
            return "stop"
        if req.sampling.stop and self.detokenize is not None:
            text = self.detokenize(req.token_ids)
            if any(s in text for s in req.sampling.stop):
                return "stop"
        if len(req.token_ids) >= req.sampling.max_tokens:
            return "length"
        if len(req.prompt_ids) + len(req.token_ids) >= self.max_positions:
            return "length"
        return None


def _top_logprobs(
    logits: torch.Tensor, temperature: float | torch.Tensor, params: list[SamplingParams]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    k = max(p.top_logprobs for p in params)
    if k == 0:
        return None
    temp = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(logits.shape[0])
    temp = torch.where(temp == 0, torch.ones_like(temp), temp)
    return (logits.float() / temp[:, None]).log_softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)


def _to_host(ids: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """(ids on the CPU, logprobs as floats) in one device-to-host copy (float64 holds every token id exactly)."""
    both = torch.stack([ids.double(), logprobs.double()]).cpu()
    return both[0].long(), both[1].tolist()

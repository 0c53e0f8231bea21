"""`POST /inference/v1/generate`: token ids in, token ids + logprobs out, in vLLM's wire format.

The endpoint verifiers' training client (`TrainClientConfig`, renderers' `generate`) and prime-rl call: the client
renders the conversation to token ids itself, so the training sequence is exactly what was sampled. Request
`{"model", "token_ids", "sampling_params": {...}}`; reply `{"request_id", "prompt_token_ids", "choices": [{"index",
"token_ids", "logprobs": {"content": [{"token": "token_id:<id>", "logprob"}]}, "finish_reason", "weight_version",
"weight_versions"}], "usage"}`. `weight_versions` (one per sampled token) is thermik's addition, for off-policy
correction. An `X-Session-ID` header keeps the episode's cached prefix in the engine between turns.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import Field

from thermik.inference.base import Generation, SamplingParams
from thermik.inference.server.errors import ApiError
from thermik.inference.server.protocol import SEED_MOD, TokenId, _Body

SESSION_HEADER = "x-session-id"
GenerateHook = Callable[[list[int], Generation], None]
"""Sees each completion of the endpoint: (prompt ids, the engine's Generation)."""


class GenerateSampling(_Body):
    """vLLM SamplingParams fields thermik's engines implement; any other field is refused with a 400."""

    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 disables it.")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop_token_ids: list[TokenId] = Field(default_factory=list)
    logprobs: int | None = Field(None, ge=0, le=1, description="The sampled token's logprob is always returned.")
    skip_special_tokens: bool = Field(True, description="Accepted and ignored: the reply holds token ids.")
    n: int = Field(1, ge=1, le=1, description="One completion per request.")


class GenerateRequest(_Body):
    model: str = Field(min_length=1)
    token_ids: list[TokenId] = Field(min_length=1, description="The prompt, already rendered by the client.")
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)


async def generate(
    server: Any, body: GenerateRequest, session_id: str | None, on_generate: GenerateHook | None = None
) -> dict[str, Any]:
    """One completion of `body.token_ids` on `server.engine` (an `OpenAIServer`), in vLLM's generate reply;
    `on_generate` sees the prompt and the engine's Generation first."""
    server._check_model(body)
    server._check_ids(body.token_ids, "token_ids")
    params = body.sampling_params
    server._check_ids(params.stop_token_ids, "sampling_params.stop_token_ids")
    max_tokens = server._max_tokens(body.token_ids, params.max_tokens, "sampling_params.max_tokens", "token_ids")
    stop_ids = tuple(dict.fromkeys([*params.stop_token_ids, *sorted(server.detok.stop_token_ids)]))
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),
        min_p=params.min_p,
        stop_token_ids=stop_ids,
        seed=None if params.seed is None else params.seed % SEED_MOD,
    )
    try:
        gen = await server.engine.generate(list(body.token_ids), sampling, session_id)
    except ValueError as exc:  # the engine refuses input it cannot serve
        raise ApiError(400, str(exc)) from exc
    if on_generate is not None:
        on_generate(list(body.token_ids), gen)
    ids = list(gen.token_ids)
    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, gen.logprobs, strict=True)]
    choice = {
        "index": 0,
        "token_ids": ids,
        "logprobs": {"content": content},
        "finish_reason": gen.stop_reason,
        "weight_version": gen.weight_version,
        "weight_versions": list(gen.weight_versions) or [gen.weight_version] * len(ids),
    }
    usage = {"prompt_tokens": len(body.token_ids), "completion_tokens": len(ids),
             "total_tokens": len(body.token_ids) + len(ids)}  # fmt: skip
    return {"request_id": f"gen-{uuid.uuid4().hex}", "prompt_token_ids": list(body.token_ids), "choices": [choice],
            "usage": usage}  # fmt: skip

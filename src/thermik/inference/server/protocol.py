"""Request bodies of the OpenAI-compatible API (the subset thermik serves) and the error body.

Unknown fields are rejected (400), as the OpenAI API does, so a typo never passes silently. OpenAI fields
thermik does not implement are accepted only at their no-op value. Extensions follow vLLM's names:
`top_k`, `min_p`, `stop_token_ids`, `return_token_ids`, `return_tokens_as_token_ids`; thermik's own extension is
the optional `session_id` (a multi-turn episode's id, so the engine keeps its cached prefix between turns).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator

TokenId = Annotated[int, Field(ge=0, lt=2**31)]
MAX_N = 64
SEED_MOD = 2**63
"""Request seeds are taken modulo this (the engines' seed range)."""
MAX_TOP_LOGPROBS = 20
MAX_GENERATIONS = 256
"""Generations one request may queue (prompts x n): one request must not monopolize the engine."""


def lone_surrogate(value: Any) -> bool:
    """True when a string inside `value` holds a lone UTF-16 surrogate (JSON's `"\\ud800"`): no tokenizer can
    encode it, so it is the request's fault."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(lone_surrogate(k) or lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(lone_surrogate(v) for v in value)
    return False


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _no_lone_surrogates(cls, v: Any) -> Any:
        if lone_surrogate(v):
            raise ValueError("the text holds a lone UTF-16 surrogate (e.g. \\ud800), which is not valid Unicode")
        return v


class StreamOptions(_Body):
    include_usage: bool = False


class FunctionCall(_Body):
    name: str
    arguments: str = Field(description="JSON object text, as the OpenAI API sends it.")


class ToolCallIn(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict, description="A JSON Schema (checked as one).")
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _json_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.validators.validator_for(v, default=jsonschema.Draft202012Validator).check_schema(v)
        except jsonschema.SchemaError as exc:
            where = "/".join(map(str, exc.absolute_path)) or "the top level"
            raise ValueError(f"not a valid JSON Schema at {where}: {exc.message}") from None
        return v


class ToolDef(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class _Sampling(_Body):
    """Fields shared by chat and text completions."""

    model: str = Field(min_length=1)
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="vLLM extension; 0 or -1 disables it.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="vLLM extension.")
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] = Field(default_factory=list, description="vLLM extension.")
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="Not implemented: only 0 is accepted.")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="Not implemented: only 0 is accepted.")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="Not implemented: must be empty.")
    user: str | None = None
    return_token_ids: bool = Field(False, description="vLLM extension: token ids of prompt and completion.")
    return_tokens_as_token_ids: bool = Field(False, description="vLLM extension: logprob tokens as 'token_id:N'.")
    session_id: str | None = Field(
        None, min_length=1, max_length=256,
        description="thermik extension: the episode this request continues; the engine keeps the session's cached "
        "prefix for its next turn. Needs a single prompt and n=1.",
    )  # fmt: skip

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class NamedFunction(_Body):
    name: str = Field(min_length=1)


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = Field(
        None,
        description="'none' returns calls as text; 'auto', 'required' and a named function parse calls. Sampling is "
        "never constrained (the policy's own tokens are what trains), so 'required' and a name are not enforced.",
    )
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: dict[str, Literal["text"]] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Literal[False] = Field(False, description="Not implemented: only false is accepted.")
    prompt_logprobs: int | None = Field(
        None, ge=0, le=0,
        description="vLLM extension: 0 returns each choice's prompt_logprobs, the logprob of every prompt token after "
        "the first given those before it (temperature 1), as [null, {\"<id>\": {\"logprob\", \"rank\", "
        "\"decoded_token\"}}, ...]; the teacher's scores in on-policy distillation. Not with stream.",
    )  # fmt: skip
    suffix: None = Field(None, description="Not implemented.")
    best_of: int | None = Field(None, ge=1, le=1, description="Not implemented: only 1 is accepted.")


class UpdateWeightsRequest(_Body):
    path: str = Field(min_length=1, description="Directory holding *.safetensors (or one *.safetensors file).")
    version: int | None = Field(
        None, ge=0, description="The weight version these weights are (a resumed run's step); absent: the next one."
    )

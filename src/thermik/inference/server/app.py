"""The FastAPI app: routes, bearer-key check and error handlers (every error is an OpenAI-style 4xx body)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from thermik.cpu.checksum import checksum
from thermik.inference.base import Generation, InferenceEngine, SamplingParams, StreamItem
from thermik.inference.remote import THERMIK_OWNER
from thermik.inference.server import outputs, streaming
from thermik.inference.server.chat_render import render_chat
from thermik.inference.server.errors import ApiError, error_body
from thermik.inference.server.generate import SESSION_HEADER, GenerateRequest, generate
from thermik.inference.server.protocol import (
    MAX_GENERATIONS,
    SEED_MOD,
    ChatCompletionRequest,
    CompletionRequest,
    UpdateWeightsRequest,
    _Sampling,
)
from thermik.tools.parsers import TOOL_CALL_OPEN

ChoiceHook = Callable[[outputs.Choice], None]
"""Sees each finished choice of a reply before it is sent (thermik.capture records the episode's turns with it)."""


class OpenAIServer:
    """Turns API requests into concurrent `engine.generate` calls (the engine batches them)."""

    def __init__(self, engine: InferenceEngine, tokenizer: Any, model_name: str, max_model_len: int) -> None:
        self.engine, self.tokenizer, self.model_name, self.max_model_len = engine, tokenizer, model_name, max_model_len
        stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
        self.detok = outputs.Detokenizer(tokenizer, sorted(stop_ids))
        self.vocab_size = len(tokenizer)

    # ------------------------------------------------------------------ shared request handling

    def _check_model(self, body: _Sampling) -> None:
        if body.model != self.model_name:
            raise ApiError(
                404, f"model {body.model!r} does not exist; this server serves {self.model_name!r}", "model",
                "model_not_found",
            )  # fmt: skip

    def _check_ids(self, ids: list[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ApiError(400, f"token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", param)

    def _max_tokens(self, prompt: list[int], requested: int | None, param: str, prompt_param: str) -> int:
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ApiError(
                400, f"the prompt has {len(prompt)} tokens; the context holds {self.max_model_len} with at least "
                "one to generate: shorten the prompt", prompt_param,
                "context_length_exceeded",
            )  # fmt: skip
        if requested is not None and requested > room:
            raise ApiError(
                400, f"{param}={requested} plus the prompt's {len(prompt)} tokens exceeds the context length "
                f"{self.max_model_len}: ask for at most {room}", param, "context_length_exceeded",
            )  # fmt: skip
        return room if requested is None else requested

    def _requests(
        self, prompts: list[list[int]], body: _Sampling, requested: int | None, top: int, param: str, prompt_param: str
    ) -> list[tuple[list[int], SamplingParams]]:
        """n engine requests per prompt, checked; `param`/`prompt_param` name the fields in errors."""
        self._check_model(body)
        if len(prompts) * body.n > MAX_GENERATIONS:
            raise ApiError(
                400, f"{len(prompts)} prompts x n={body.n} = {len(prompts) * body.n} generations; one request may ask "
                f"for at most {MAX_GENERATIONS}: split it", prompt_param, "too_many_generations",
            )  # fmt: skip
        self._check_ids(body.stop_token_ids, "stop_token_ids")
        for prompt in prompts:
            if not prompt:
                raise ApiError(400, "the prompt is empty: send at least one token", prompt_param)
        if body.session_id is not None and (len(prompts) > 1 or body.n > 1):
            raise ApiError(400, "session_id continues one episode: send a single prompt with n=1", "session_id")
        limits = [self._max_tokens(p, requested, param, prompt_param) for p in prompts]
        return [
            (
                prompt,
                SamplingParams(
                    max_tokens=max_tokens,
                    temperature=body.temperature,
                    top_p=body.top_p,
                    top_k=max(body.top_k, 0),
                    min_p=body.min_p,
                    stop_token_ids=tuple(body.stop_token_ids),
                    stop=body.stop_strings(),
                    seed=None if body.seed is None else (body.seed + i) % SEED_MOD,
                    top_logprobs=top,
                ),
            )
            for prompt, max_tokens in zip(prompts, limits, strict=True)
            for i in range(body.n)
        ]

    async def _generations(self, requests: list[tuple[list[int], SamplingParams]], body: _Sampling) -> list[Generation]:
        try:
            return await asyncio.gather(*(self.engine.generate(p, s, body.session_id) for p, s in requests))
        except ValueError as exc:  # the engine refuses input it cannot serve
            raise ApiError(400, str(exc)) from exc

    async def _generate(
        self,
        prompts: list[list[int]],
        body: _Sampling,
        requested: int | None,
        top: int,
        param: str,
        prompt_param: str,
        on_choice: ChoiceHook | None = None,
    ) -> list[outputs.Choice]:
        requests = self._requests(prompts, body, requested, top, param, prompt_param)
        gens = await self._generations(requests, body)
        stop_ids = frozenset(body.stop_token_ids)
        choices = [
            outputs.finish(g, k, prompt, self.detok, sampling.stop, stop_ids)
            for k, (g, (prompt, sampling)) in enumerate(zip(gens, requests, strict=True))
        ]
        for choice in choices if on_choice is not None else ():
            on_choice(choice)
        return choices

    async def _open_streams(
        self, requests: list[tuple[list[int], SamplingParams]], body: _Sampling, hold_from: str | None
    ) -> tuple[list[AsyncIterator[StreamItem]], list[streaming.ChoiceStream]]:
        """One source per choice: the engine's token stream where it has one (requests are queued, and refused
        with a 400, before the response starts), else its finished generation."""
        stream = getattr(self.engine, "stream", None)
        if stream is None:
            sources = [streaming.finished(g) for g in await self._generations(requests, body)]
        else:
            try:
                sources = [stream(p, s, body.session_id) for p, s in requests]
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc
        stops, stop_ids = body.stop_strings(), frozenset(body.stop_token_ids)
        streams = [
            streaming.ChoiceStream(k, prompt, self.detok, stops, stop_ids, hold_from)
            for k, (prompt, _) in enumerate(requests)
        ]
        return sources, streams

    # ------------------------------------------------------------------ /v1/completions

    def _completion_prompts(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        items: list[Any] = [prompt] if isinstance(prompt, str) else list(prompt)
        if not items:
            raise ApiError(400, "prompt is an empty list: send a string, strings, token ids or lists of ids", "prompt")
        if all(isinstance(x, int) for x in items):
            items = [items]
        prompts = [self.tokenizer.encode(x, add_special_tokens=False) if isinstance(x, str) else x for x in items]
        for ids in prompts:
            self._check_ids(ids, "prompt")
        return prompts

    async def _prompt_logprobs(self, prompts: list[list[int]]) -> list[list[dict[str, Any] | None]]:
        """vLLM's prompt_logprobs of each prompt: None for the first token, then {"<id>": {logprob, rank,
        decoded_token}}."""
        score = getattr(self.engine, "prompt_logprobs", None)
        if score is None:
            raise ApiError(400, "this server's engine cannot score prompts: drop prompt_logprobs", "prompt_logprobs")
        try:
            results = await asyncio.gather(*(score(p) for p in prompts))
        except ValueError as exc:
            raise ApiError(400, str(exc), "prompt") from exc
        return [
            [None]
            + [
                {str(t): {"logprob": lp, "rank": rank, "decoded_token": self.tokenizer.decode([t])}}
                for t, (lp, rank) in zip(p[1:], scores, strict=True)
            ]
            for p, scores in zip(prompts, results, strict=True)
        ]

    async def completions(self, body: CompletionRequest) -> Any:
        return await self.completion_reply(body, self._completion_prompts(body.prompt))

    async def completion_reply(
        self, body: CompletionRequest, prompts: list[list[int]], on_choice: ChoiceHook | None = None
    ) -> Any:
        """The /v1/completions reply for `prompts` (already tokenized and checked); `on_choice` sees each finished
        choice before the reply (or its closing chunks) is sent."""
        top = body.logprobs or 0
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name}  # fmt: skip
        as_ids = body.return_tokens_as_token_ids

        def logprobs(c: outputs.Choice, span: slice = slice(None)) -> dict | None:
            return None if body.logprobs is None else outputs.completion_logprobs(c, self.detok, top, as_ids, span)

        if body.stream:
            if body.prompt_logprobs is not None:
                raise ApiError(400, "prompt_logprobs is not available with stream: send stream=false", "stream")
            requests = self._requests(prompts, body, body.max_tokens, top, "max_tokens", "prompt")
            sources, streams = await self._open_streams(requests, body, None)

            def entry(c: outputs.Choice, pos: int, piece: str) -> dict[str, Any]:
                out = {"index": c.index, "text": piece, "logprobs": logprobs(c, slice(pos, pos + 1)),
                       "finish_reason": None}  # fmt: skip
                if body.return_token_ids:
                    out["token_ids"] = [c.token_ids[pos]]
                    if pos == 0:
                        out["prompt_token_ids"] = c.prompt_ids
                return out

            def final(stream: streaming.ChoiceStream, c: outputs.Choice) -> streaming.Entries:
                last = {"index": c.index, "text": "", "logprobs": None, "finish_reason": c.finish_reason}
                return [*([entry(c, pos, piece)] for pos, piece in stream.rest(c)), [last]]

            usage = _stream_usage(body, prompts)
            return _sse(streaming.event_stream(head, sources, streams, [], entry, final, usage, on_choice))

        scored = await self._prompt_logprobs(prompts) if body.prompt_logprobs is not None else None
        choices = await self._generate(prompts, body, body.max_tokens, top, "max_tokens", "prompt", on_choice)
        use = outputs.usage(prompts, choices)

        def choice(c: outputs.Choice) -> dict[str, Any]:
            out = {"index": c.index, "text": c.text, "logprobs": logprobs(c), "finish_reason": c.finish_reason}
            if body.return_token_ids:
                out |= {"prompt_token_ids": c.prompt_ids, "token_ids": c.token_ids, **outputs.versions(c)}
            if scored is not None:
                out["prompt_logprobs"] = scored[c.index // body.n]
            return out

        return {**head, "choices": [choice(c) for c in choices], "usage": use}

    # ------------------------------------------------------------------ /v1/chat/completions

    async def chat_completions(self, body: ChatCompletionRequest) -> Any:
        return await self.chat_reply(body, render_chat(self.tokenizer, body))

    async def chat_reply(
        self, body: ChatCompletionRequest, prompt: list[int], on_choice: ChoiceHook | None = None
    ) -> Any:
        """The /v1/chat/completions reply for the prompt ids `prompt` of `body`'s messages; `on_choice` sees each
        finished choice before the reply (or its closing chunks) is sent."""
        self._check_ids(prompt, "messages")
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        requested = body.max_completion_tokens or body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name}  # fmt: skip
        parse_tools = bool(body.tools) and body.tool_choice != "none"
        as_ids = body.return_tokens_as_token_ids

        def message(c: outputs.Choice) -> tuple[dict[str, Any], str]:
            content, calls = outputs.tool_calls_of(c.text) if parse_tools else (c.text, [])
            calls = calls if body.parallel_tool_calls else calls[:1]
            if calls:
                return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
            return {"role": "assistant", "content": content}, c.finish_reason

        def logprobs(c: outputs.Choice, span: slice = slice(None)) -> dict | None:
            return outputs.chat_logprobs(c, self.detok, top, as_ids, span) if body.logprobs else None

        if body.stream:
            requests = self._requests([prompt], body, requested, top, param, "messages")
            sources, streams = await self._open_streams(requests, body, TOOL_CALL_OPEN if parse_tools else None)
            return self._chat_stream(head, sources, streams, message, logprobs, body, [prompt], on_choice)

        choices = await self._generate([prompt], body, requested, top, param, "messages", on_choice)
        use = outputs.usage([prompt], choices)

        def choice(c: outputs.Choice) -> dict[str, Any]:
            msg, reason = message(c)
            out = {"index": c.index, "message": msg, "logprobs": logprobs(c), "finish_reason": reason}
            if body.return_token_ids:
                out |= {"token_ids": c.token_ids, **outputs.versions(c)}
            return out

        response = {**head, "choices": [choice(c) for c in choices], "usage": use}
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt
        return response

    def _chat_stream(
        self,
        head: dict[str, Any],
        sources: list[AsyncIterator[StreamItem]],
        streams: list[streaming.ChoiceStream],
        message: Callable[[outputs.Choice], tuple[dict[str, Any], str]],
        logprobs: Callable[..., dict | None],
        body: ChatCompletionRequest,
        prompts: list[list[int]],
        on_choice: ChoiceHook | None = None,
    ) -> StreamingResponse:
        """Content streams token by token. A reply's tool calls are parsed when it ends (the text from the first
        call's opening tag on is held back): then any content after the last streamed piece, and each call as
        OpenAI streams one: a chunk with its index, id, type and name (arguments ""), then its arguments in pieces."""
        head = {**head, "object": "chat.completion.chunk"}
        first = [[{"index": s.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                   "finish_reason": None}] for s in streams]  # fmt: skip

        def entry(c: outputs.Choice, pos: int, piece: str) -> dict[str, Any]:
            out = {"index": c.index, "delta": {"content": piece}, "logprobs": logprobs(c, slice(pos, pos + 1)),
                   "finish_reason": None}  # fmt: skip
            if body.return_token_ids:
                out["token_ids"] = [c.token_ids[pos]]
            return out

        def final(stream: streaming.ChoiceStream, c: outputs.Choice) -> streaming.Entries:
            msg, reason = message(c)
            last = [{"index": c.index, "delta": {}, "logprobs": None, "finish_reason": reason}]
            if reason != "tool_calls":
                return [*([entry(c, pos, piece)] for pos, piece in stream.rest(c)), last]
            content = msg["content"] or ""
            rest = content[len(stream.sent_text) :] if content.startswith(stream.sent_text) else ""
            deltas = [{"content": rest}] if rest else []
            deltas += [{"tool_calls": [call]} for i, tc in enumerate(msg["tool_calls"]) for call in _call_deltas(i, tc)]
            chunks = [[{"index": c.index, "delta": d, "logprobs": None, "finish_reason": None}] for d in deltas]
            chunks[0][0]["logprobs"] = logprobs(c, slice(stream.sent, None))  # the held tokens, with the first piece
            if body.return_token_ids:
                chunks[0][0]["token_ids"] = c.token_ids[stream.sent :]
            return [*chunks, last]

        usage = _stream_usage(body, prompts)
        return _sse(streaming.event_stream(head, sources, streams, first, entry, final, usage, on_choice))

    # ------------------------------------------------------------------ weights and status

    async def update_weights(self, body: UpdateWeightsRequest) -> dict[str, Any]:
        path = Path(body.path)
        if not path.exists():
            raise ApiError(400, f"weights path {path} does not exist on the server's filesystem", "path")
        try:
            if body.version is None:
                version = await self.engine.update_weights(path)
            else:
                version = await self.engine.update_weights(path, body.version)
        except Exception as exc:  # unreadable files, unknown names, wrong shapes: the request's fault, not ours
            raise ApiError(400, f"could not load weights from {path}: {exc}", "path") from exc
        return {"weight_version": version}

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "weight_version": self.engine.weight_version}

    async def weight_version(self) -> dict[str, int]:
        return {"weight_version": self.engine.weight_version}

    async def weight_checksums(self) -> dict[str, Any]:
        """{name: [dtype, exact checksum]} of the weights the engine serves (cpu/checksum.py), for the weight checksum
        guard of a split run; 404 when the engine's weights are not readable here."""
        model = getattr(self.engine, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise ApiError(404, f"{type(self.engine).__name__} holds no weights this server can read", None)
        state = model.state_dict()
        sums = await asyncio.to_thread(
            lambda: {k: [str(v.dtype).removeprefix("torch."), checksum(v)] for k, v in state.items()}
        )
        return {"weight_version": self.engine.weight_version, "checksums": sums}

    async def models(self) -> dict[str, Any]:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": THERMIK_OWNER,
                "max_model_len": self.max_model_len}  # fmt: skip
        return {"object": "list", "data": [card]}


ARGUMENT_PIECE = 8  # characters of a tool call's arguments per streamed chunk


def _call_deltas(index: int, call: dict[str, Any]) -> list[dict[str, Any]]:
    """One tool call as the deltas of an OpenAI stream: its id, type and name first, then its arguments in pieces."""
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    opening = {"index": index, "id": call["id"], "type": "function", "function": {"name": name, "arguments": ""}}
    pieces = [arguments[k : k + ARGUMENT_PIECE] for k in range(0, len(arguments), ARGUMENT_PIECE)]
    return [opening, *({"index": index, "function": {"arguments": piece}} for piece in pieces)]


def _stream_usage(body: _Sampling, prompts: list[list[int]]) -> Callable[[list[outputs.Choice]], dict[str, int] | None]:
    """The usage chunk of a stream, if the request asked for one (`stream_options.include_usage`)."""
    wanted = body.stream_options is not None and body.stream_options.include_usage
    return lambda choices: outputs.usage(prompts, choices) if wanted else None


def _sse(events: Any) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _split_loc(loc: tuple[Any, ...]) -> tuple[list[str], str | None]:
    """(field path, union member tag or None): pydantic puts the tried type ('str', 'list[int]') into the loc."""
    path: list[str] = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, str) and (not part.isidentifier() or part in _TYPE_TAGS):
            return path, part
        path.append(str(part))
    return path, None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    # A value our own validators refused says more than "matches none of the accepted forms" of a union.
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0])
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', 'decode error')}", None
    path, tag = _split_loc(tuple(first.get("loc", ())))
    param = ".".join(path) or None
    message = f"{param or 'body'}: {first.get('msg', 'invalid')}"
    if tag is not None and first.get("type") != "value_error":
        tags = sorted({t for e in errors if (t := _split_loc(tuple(e.get("loc", ())))[1])})
        message = f"{param}: matches none of the accepted forms ({', '.join(tags)}); e.g. {first.get('msg')}"
    elif len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    return message, param


def _install_error_handlers(app: FastAPI) -> None:
    def reply(status: int, message: str, type_: str, param: str | None, code: str | None) -> JSONResponse:
        return JSONResponse(error_body(message, type_, param, code), status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return reply(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return reply(400, message, "invalid_request_error", param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return reply(exc.status_code, str(exc.detail), "invalid_request_error", None, code)


def build_app(
    engine: InferenceEngine,
    tokenizer: Any,
    model_name: str,
    api_key: str | None = None,
    max_model_len: int = 2048,
) -> FastAPI:
    """OpenAI-compatible app over `engine`. `tokenizer` is the model's HF tokenizer (with its chat template)."""
    server = OpenAIServer(engine, tokenizer, model_name, max_model_len)

    async def check_key(request: Request) -> None:
        if not api_key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", None,
                           "invalid_api_key")  # fmt: skip

    app = FastAPI(title="thermik inference", version="1", description=__doc__)
    _install_error_handlers(app)
    auth = [Depends(check_key)]
    app.get("/health")(server.health)
    app.get("/weight_version", dependencies=auth)(server.weight_version)
    app.get("/weight_checksums", dependencies=auth)(server.weight_checksums)
    app.get("/v1/models", dependencies=auth)(server.models)
    app.post("/v1/completions", dependencies=auth)(server.completions)
    app.post("/v1/chat/completions", dependencies=auth)(server.chat_completions)
    app.post("/update_weights", dependencies=auth)(server.update_weights)

    @app.post("/inference/v1/generate", dependencies=auth)
    async def token_generate(body: GenerateRequest, request: Request) -> dict[str, Any]:
        """vLLM's token-in endpoint (verifiers' and prime-rl's training clients): inference/server/generate.py."""
        return await generate(server, body, request.headers.get(SESSION_HEADER))

    app.state.server = server
    return app

"""The capture routes on the inference app: `/episodes/{id}/v1/...`, and the plain `/v1/...` routes for an
episode's API key.

Bodies are read leniently: a field thermik does not serve is ignored (as OpenAI ignores what a model does not use),
a served field with a bad value is a 400. The episode id in the URL is the capability; an episode's key on the plain
routes is routed to its episode before the server's own key check.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from thermik.capture.episode import Episode, EpisodeFinished
from thermik.capture.messages import Message, assistant_message
from thermik.capture.responses import ResponsesRequest, input_messages, output_items, response_object, stream_events
from thermik.inference.base import Generation
from thermik.inference.server import outputs
from thermik.inference.server.chat_render import template_message
from thermik.inference.server.errors import ApiError
from thermik.inference.server.generate import GenerateRequest, generate
from thermik.inference.server.protocol import ChatCompletionRequest, CompletionRequest, _Body
from thermik.tools.parsers import TOOL_CALL_OPEN

if TYPE_CHECKING:
    from thermik.capture.registry import Capture

RETRY_HEADER = "x-stainless-retry-count"


class RewardBody(_Body):
    reward: float = Field(allow_inf_nan=False)
    metrics: dict[str, float] = Field(default_factory=dict)


Body = TypeVar("Body", bound=BaseModel)
ROUTES = frozenset({*(f"/v1/{r}" for r in ("chat/completions", "completions", "responses", "models")),
                    "/inference/v1/generate"})  # fmt: skip
"""Plain routes an episode key sends to the episode's own."""
RETRIEVED = "/v1/responses/"  # GET /v1/responses/{id}: routed by an episode key too


async def read_body(request: Request, model: type[Body]) -> tuple[Body, str]:
    """(the body as `model`, unknown fields ignored; its fingerprint for retry detection)."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        body = model.model_validate(data, extra="ignore")
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from exc
    return body, hashlib.sha256(request.url.path.encode() + b"\0" + raw).hexdigest()


def _is_retry(request: Request) -> bool:
    try:
        return int(request.headers.get(RETRY_HEADER, "0")) > 0
    except ValueError:
        return False


class CaptureRoutes:
    """Serves each route for an episode; `capture` holds the episodes and the OpenAI server over the engine."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.server = capture.server

    async def _turn(self, episode: Episode, messages: list[Message], tools: Any, fingerprint: str, retry: bool,
                    reply: Callable[[], Awaitable[Any]], raw: list[int] | None = None) -> Any:  # fmt: skip
        """One model call of `episode`: its prompt (`raw`: the client's own token ids), `reply()`, and the turn
        undone if the reply was not recorded. A streamed reply holds the episode until its stream ends."""
        await episode.lock.acquire()
        streaming = False
        try:
            try:
                episode.begin(messages, tools, fingerprint, retry, raw)
                result = await reply()
            except EpisodeFinished as exc:
                episode.fail(exc)
                raise
            except ApiError as exc:
                if exc.code == "context_length_exceeded":  # the context is a budget too
                    finished = EpisodeFinished(f"the episode outgrew the context: {exc.message}", "length")
                    episode.fail(finished)
                    raise finished from exc
                raise
            if isinstance(result, StreamingResponse):
                result.body_iterator, streaming = _then_release(result.body_iterator, episode), True
            return result
        finally:
            if not streaming:
                episode.end()
                episode.lock.release()

    def _new_tokens(self, episode: Episode, requested: int | None) -> int | None:
        """What a turn may sample: the request's limit within the token budget and the context's room (a harness's
        max_tokens larger than the room left is cut to it; no room at all ends the episode)."""
        room = self.server.max_model_len - len(episode.prompt_ids())
        limit = episode.max_new_tokens(requested)
        return limit if room < 1 else min(limit or room, room)

    def _sampling(self, episode: Episode, body: Body, **fields: Any) -> Body:
        """`body` with the episode's fixed sampling fields and the model the server serves."""
        return body.model_copy(update={"model": self.server.model_name, **fields, **episode.limits.sampling})

    async def chat(self, episode_id: str, request: Request) -> Any:
        episode = self.capture.episode(episode_id)
        body, fingerprint = await read_body(request, ChatCompletionRequest)
        if body.n != 1:
            raise ApiError(400, "an episode's request samples one choice: send n=1", "n")
        messages = [template_message(m, i) for i, m in enumerate(body.messages)]
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        parse_tools = bool(body.tools) and body.tool_choice != "none"

        def record(choice: outputs.Choice) -> None:
            content, calls = outputs.tool_calls_of(choice.text) if parse_tools else (choice.text, [])
            episode.record(choice, assistant_message(content, calls if body.parallel_tool_calls else calls[:1]))

        async def reply() -> Any:
            requested = self._new_tokens(episode, body.max_completion_tokens or body.max_tokens)
            field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            sampled = self._sampling(episode, body, session_id=episode.id, **{field: requested})
            return await self.server.chat_reply(sampled, episode.prompt_ids(), record)

        return await self._turn(episode, messages, tools, fingerprint, _is_retry(request), reply)

    async def completions(self, episode_id: str, request: Request) -> Any:
        """A text prompt continues the sample when its tokens extend the sample's, else starts a new one."""
        episode = self.capture.episode(episode_id)
        body, fingerprint = await read_body(request, CompletionRequest)
        prompts = self.server._completion_prompts(body.prompt)
        if len(prompts) != 1 or body.n != 1:
            raise ApiError(400, "an episode's request samples one choice of one prompt: send one prompt, n=1", "prompt")

        def record(choice: outputs.Choice) -> None:
            episode.record(choice, {"role": "assistant", "content": choice.text})

        async def reply() -> Any:
            sampled = self._sampling(episode, body, session_id=episode.id,
                                     max_tokens=self._new_tokens(episode, body.max_tokens))  # fmt: skip
            return await self.server.completion_reply(sampled, [episode.prompt_ids()], record)

        return await self._turn(episode, [], None, fingerprint, _is_retry(request), reply, prompts[0])

    async def responses(self, episode_id: str, request: Request) -> Any:
        episode = self.capture.episode(episode_id)
        body, fingerprint = await read_body(request, ResponsesRequest)
        earlier: list[Message] = []
        if body.previous_response_id is not None:
            if body.previous_response_id not in episode.responses:
                raise ApiError(400, f"previous response {body.previous_response_id!r} is not one of this episode's",
                               "previous_response_id", "previous_response_not_found")  # fmt: skip
            earlier = episode.responses[body.previous_response_id]
        conversation = [*earlier, *input_messages(body.input)]
        system = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
        chat = ChatCompletionRequest(model=self.server.model_name, messages=[{"role": "user", "content": "."}],
                                     tools=body.chat_tools(), tool_choice=body.chat_tool_choice(),
                                     temperature=body.temperature, top_p=body.top_p)  # fmt: skip
        response_id = f"resp_{uuid.uuid4().hex}"
        parse_tools = bool(chat.tools) and chat.tool_choice != "none"

        def record(choice: outputs.Choice, message_id: str = "") -> dict[str, Any]:
            content, calls = outputs.tool_calls_of(choice.text) if parse_tools else (choice.text, [])
            calls = calls if body.parallel_tool_calls else calls[:1]
            reply_message = assistant_message(content, calls)
            episode.record(choice, reply_message)
            episode.responses[response_id] = [*conversation, reply_message]
            output = output_items(content, calls, message_id)
            response = response_object(body, response_id, self.server.model_name, output, choice)
            episode.response_objects[response_id] = response
            return response

        async def reply() -> Any:
            sampled = self._sampling(episode, chat, session_id=episode.id)
            requested = self._new_tokens(episode, body.max_output_tokens)
            requests = self.server._requests([episode.prompt_ids()], sampled, requested, 0, "max_output_tokens",
                                             "input")  # fmt: skip
            if not body.stream:
                (gen,) = await self.server._generations(requests, sampled)
                return record(outputs.finish(gen, 0, requests[0][0], self.server.detok, (), frozenset()))
            sources, streams = await self.server._open_streams(
                requests, sampled, TOOL_CALL_OPEN if parse_tools else None
            )
            start = response_object(body, response_id, self.server.model_name, [], None)
            events = stream_events(start, sources[0], streams[0], record)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        tools = chat.tools and [t.model_dump(exclude_none=True) for t in chat.tools]
        return await self._turn(episode, [*system, *conversation], tools, fingerprint, _is_retry(request), reply)

    async def retrieve_response(self, episode_id: str, response_id: str) -> dict[str, Any]:
        """`GET /responses/{id}`: a response this episode made (after a budget ended it too); 404 for any other."""
        episode = self.capture.episode(episode_id, finished_too=True)
        response = episode.response_objects.get(response_id)
        if response is None:
            raise ApiError(404, f"response {response_id!r} is not one of this episode's", None, "response_not_found")
        return response

    async def generate(self, episode_id: str, request: Request) -> dict[str, Any]:
        """vLLM's token-in `/inference/v1/generate` (verifiers' and prime-rl's training clients render the prompt
        themselves): the sample continues when the ids extend its tokens, else a new one starts."""
        episode = self.capture.episode(episode_id)
        body, fingerprint = await read_body(request, GenerateRequest)

        def record(prompt: list[int], gen: Generation) -> None:
            choice = outputs.finish(gen, 0, prompt, self.server.detok, (), frozenset())
            episode.record(choice, {"role": "assistant", "content": choice.text})

        async def reply() -> Any:
            limit = self._new_tokens(episode, body.sampling_params.max_tokens)
            params = body.sampling_params.model_copy(update={"max_tokens": limit, **episode.limits.sampling})
            sampled = body.model_copy(update={"model": self.server.model_name, "sampling_params": params})
            return await generate(self.server, sampled, episode.id, record)

        return await self._turn(episode, [], None, fingerprint, _is_retry(request), reply, list(body.token_ids))

    async def reward(self, episode_id: str, request: Request) -> dict[str, Any]:
        """`{"reward": float, "metrics": {name: float}}` from the harness: the episode's reward (on its last sampled
        token when it is closed) and metrics; a later post replaces an earlier one. Accepted after a budget ended
        the episode too."""
        episode = self.capture.episode(episode_id, finished_too=True)
        body, _ = await read_body(request, RewardBody)
        episode.reward, episode.reward_metrics = body.reward, dict(body.metrics)
        return {"episode": episode.id, "reward": body.reward}

    async def models(self, episode_id: str) -> Any:
        self.capture.episode(episode_id)
        return await self.server.models()


async def _then_release(events: AsyncIterator[Any], episode: Episode) -> AsyncIterator[Any]:
    try:
        async for event in events:
            yield event
    finally:
        episode.end()
        episode.lock.release()


def mount(app: FastAPI, routes: CaptureRoutes) -> None:
    """The episode routes, and the episode-key router in front of the plain /v1 routes."""
    base = "/episodes/{episode_id}/v1"
    app.post(f"{base}/chat/completions")(routes.chat)
    app.post(f"{base}/completions")(routes.completions)
    app.post(f"{base}/responses")(routes.responses)
    app.get(f"{base}/responses/{{response_id}}")(routes.retrieve_response)
    app.get(f"{base}/models")(routes.models)
    app.post("/episodes/{episode_id}/reward")(routes.reward)
    app.post("/episodes/{episode_id}/inference/v1/generate")(routes.generate)
    app.add_middleware(EpisodeKeyRouter, capture=routes.capture)


class EpisodeKeyRouter:
    """ASGI middleware: a plain `/v1/<route>` request whose bearer key is an episode's goes to that episode's URL."""

    def __init__(self, app: Any, capture: Capture) -> None:
        self.app, self.capture = app, capture

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (scope["path"] in ROUTES or scope["path"].startswith(RETRIEVED)):
            headers = dict(scope.get("headers") or [])
            scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            episode_id = self.capture.id_of_key(token.strip()) if scheme.lower() == "bearer" else None
            if episode_id is not None:
                path = f"/episodes/{episode_id}{scope['path']}"
                scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)

"""The Responses API (`POST /responses`) over the chat path: request -> chat messages, reply -> Response object.

Input: a string or items (messages with `input_text`/`output_text` parts, `function_call`, `function_call_output`;
`reasoning` items are skipped), `instructions` as the first system message, flat function tools, `tool_choice`,
`parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`, and `previous_response_id` (a response of the
same episode: its conversation comes first; its instructions are not carried over, as OpenAI does). Output: a
`message` item with one `output_text` part, then a `function_call` item per call. A reply cut by the token limit is
`incomplete` (reason `max_output_tokens`). `stream: true` sends the documented events in their order, then
`response.completed` carrying the whole response.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from thermik.capture.messages import Message
from thermik.inference.server.chat_render import call_arguments
from thermik.inference.server.errors import ApiError
from thermik.inference.server.outputs import Choice, Detokenizer, stream_pieces
from thermik.inference.server.protocol import FunctionDef, NamedFunction, NamedToolChoice, _Body


class FunctionTool(FunctionDef):
    """A Responses function tool: flat (`{type, name, description, parameters, strict}`)."""

    type: Literal["function"] = "function"


class ResponsesToolChoice(_Body):
    type: Literal["function"]
    name: str = Field(min_length=1)


class ResponsesRequest(_Body):
    """The fields thermik serves; any other field is ignored, as OpenAI ignores what a model does not use."""

    model: str = ""
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesToolChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    previous_response_id: str | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (nested under `function`), as the chat route renders them."""
        if not self.tools:
            return None
        return [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in self.tools]

    def chat_tool_choice(self) -> str | NamedToolChoice | None:
        if isinstance(self.tool_choice, ResponsesToolChoice):
            return NamedToolChoice(function=NamedFunction(name=self.tool_choice.name))
        return self.tool_choice


def _text(content: Any, where: str) -> str:
    """A message item's content: a string or text parts (input_text, output_text, text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, "content must be a string or a list of parts", where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(400, f"content part of type {kind!r} is not supported: send text parts", f"{where}.{j}")
        if not isinstance(part.get("text"), str):
            raise ApiError(400, "a text part needs a string `text`", f"{where}.{j}.text")
        texts.append(part["text"])
    return "".join(texts)


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise ApiError(400, f"a {item.get('type', 'message')} item needs a string `{name}`", f"{where}.{name}")
    return value


def input_messages(items: str | list[dict[str, Any]]) -> list[Message]:
    """Responses input items as chat messages; consecutive assistant text and calls form one assistant message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Message] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise ApiError(400, "an input item must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"unknown role {role!r}: user, system, developer or assistant", f"{where}.role")
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant" and messages and messages[-1]["role"] == "assistant":
                messages[-1]["content"] = (messages[-1]["content"] or "") + text
            else:
                messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function", "function": {
                "name": _field(item, "name", where),
                "arguments": call_arguments(_field(item, "arguments", where), f"{where}.arguments"),
            }}  # fmt: skip
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "content": text, "tool_call_id": _field(item, "call_id", where)})
        elif kind != "reasoning":
            raise ApiError(400, f"input items of type {kind!r} are not supported", f"{where}.type")
    return messages


def output_items(content: str | None, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A reply as Responses output items (completed): its text as a message, then one function_call per call."""
    items: list[dict[str, Any]] = []
    if content or not calls:
        part = {"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
                      "content": [part]})  # fmt: skip
    for call in calls:
        items.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                      "status": "completed"})  # fmt: skip
    return items


def response_object(
    body: ResponsesRequest, response_id: str, model: str, output: list[dict[str, Any]], choice: Choice | None
) -> dict[str, Any]:
    """The Response: in progress (`choice` None, no output yet), completed, or incomplete at the token limit."""
    status = "in_progress" if choice is None else "completed"
    details = None
    if choice is not None and choice.finish_reason == "length":
        status, details = "incomplete", {"reason": "max_output_tokens"}
    usage = None
    if choice is not None:
        usage = {"input_tokens": len(choice.prompt_ids), "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": len(choice.token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": len(choice.prompt_ids) + len(choice.token_ids)}  # fmt: skip
    tool_choice = body.tool_choice or "auto"
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "error": None, "incomplete_details": details, "instructions": body.instructions, "model": model,
        "output": output, "parallel_tool_calls": body.parallel_tool_calls,
        "temperature": body.temperature, "top_p": body.top_p, "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id, "metadata": body.metadata or {},
        "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "reasoning": None, "store": True,
        "usage": usage,
    }  # fmt: skip


def _event(kind: str, counter: Iterator[int], **fields: Any) -> str:
    data = {"type": kind, "sequence_number": next(counter), **fields}
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream_events(start: dict[str, Any], final: dict[str, Any], choice: Choice, detok: Detokenizer) -> Iterator[str]:
    """The events of a finished reply in the documented order: created, in_progress, per item its added / delta /
    done events, completed (or incomplete) with the whole response. Text deltas are the tokens' text pieces."""
    seq = iter(range(1 << 62))
    yield _event("response.created", seq, response=start)
    yield _event("response.in_progress", seq, response=start)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            yield from _message_events(item, index, choice, detok, seq)
        else:
            yield from _call_events(item, index, seq)
    yield _event(f"response.{'completed' if final['status'] == 'completed' else 'incomplete'}", seq, response=final)


def _message_events(item: dict[str, Any], index: int, choice: Choice, detok: Detokenizer, seq: Iterator[int]) -> Any:
    part, where = item["content"][0], {"item_id": item["id"], "output_index": index}
    text = part["text"]
    yield _event("response.output_item.added", seq, output_index=index,
                 item={**item, "status": "in_progress", "content": []})  # fmt: skip
    yield _event("response.content_part.added", seq, **where, content_index=0, part={**part, "text": ""})
    pieces = stream_pieces(detok, choice.token_ids, choice.text) if text == choice.text else [text]
    for piece in pieces:
        if piece:
            yield _event("response.output_text.delta", seq, **where, content_index=0, delta=piece, logprobs=[])
    yield _event("response.output_text.done", seq, **where, content_index=0, text=text, logprobs=[])
    yield _event("response.content_part.done", seq, **where, content_index=0, part=part)
    yield _event("response.output_item.done", seq, output_index=index, item=item)


def _call_events(item: dict[str, Any], index: int, seq: Iterator[int]) -> Any:
    where = {"item_id": item["id"], "output_index": index}
    yield _event("response.output_item.added", seq, output_index=index,
                 item={**item, "arguments": "", "status": "in_progress"})  # fmt: skip
    yield _event("response.function_call_arguments.delta", seq, **where, delta=item["arguments"])
    yield _event("response.function_call_arguments.done", seq, **where, name=item["name"],
                 arguments=item["arguments"])  # fmt: skip
    yield _event("response.output_item.done", seq, output_index=index, item=item)

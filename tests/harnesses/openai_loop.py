"""A plain openai SDK tool loop (chat completions, streamed or not): the harness of tests/test_agent_harnesses.py.

Entrypoint `openai_loop:run` or command `python openai_loop.py [--stream]`. It offers one tool, runs the calls the
model makes, and asks once more after the first answer (two turns that extend one history); answers the last text.
"""

from __future__ import annotations

import json
import os
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def _turn(client: OpenAI, model: str, messages: list, stream: bool) -> dict:
    if not stream:
        message = (
            client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=8).choices[0].message
        )
        return message.model_dump(exclude_none=True)
    text, calls = "", {}
    for chunk in client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=8, stream=True, stream_options={"include_usage": True}
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.id or slot["id"]
                slot["function"]["name"] += (call.function and call.function.name) or ""
                slot["function"]["arguments"] += (call.function and call.function.arguments) or ""
    return {"role": "assistant", "content": text, **({"tool_calls": list(calls.values())} if calls else {})}


def run(task: dict, client_config: dict, stream: bool = False) -> dict:
    client = OpenAI(base_url=client_config["base_url"], api_key=client_config["api_key"], max_retries=0)
    messages, asked_again = list(task["prompt"]), False
    for _ in range(6):
        reply = _turn(client, client_config["model"], messages, stream)
        messages.append(reply)
        for call in reply.get("tool_calls", []):
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
                result = str(int(args["a"]) + int(args["b"]))
            except Exception as exc:  # a tiny model's arguments
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        if not reply.get("tool_calls"):
            if asked_again:
                break
            messages.append({"role": "user", "content": "Say it once more."})
            asked_again = True
    answer = reply.get("content") or ""
    return {"answer": answer, "messages": messages, "tools": TOOLS, "metrics": {"harness_turns": len(messages)}}


if __name__ == "__main__":
    client = {
        "base_url": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ["OPENAI_API_KEY"],
        "model": os.environ["OPENAI_MODEL"],
    }
    print(json.dumps(run(json.loads(os.environ["THERMIK_TASK"]), client, stream="--stream" in sys.argv)))

"""An openai-agents Agent with one function tool: the harness of tests/test_agent_harnesses.py.

Command `python agents_sdk.py chat|responses [--stream]`: OpenAIChatCompletionsModel or OpenAIResponsesModel, run with
Runner.run or Runner.run_streamed; tracing off. Answers the final output.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run(task: dict, client_config: dict, api: str = "chat", stream: bool = False) -> dict:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=client_config["base_url"], api_key=client_config["api_key"], max_retries=0)
    kind = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    agent = Agent(
        name="calc",
        instructions="Answer briefly; use add for sums.",
        tools=[add],
        model=kind(model=client_config["model"], openai_client=client),
    )
    question = task["prompt"][-1]["content"]
    if stream:
        result = Runner.run_streamed(agent, question, max_turns=4)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, question, max_turns=4)
    return {"answer": str(result.final_output or "")}


if __name__ == "__main__":
    client = {
        "base_url": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ["OPENAI_API_KEY"],
        "model": os.environ["OPENAI_MODEL"],
    }
    task = json.loads(os.environ["THERMIK_TASK"])
    print(json.dumps(asyncio.run(run(task, client, sys.argv[1], "--stream" in sys.argv))))

"""A LangGraph agent (langchain's create_agent over langchain-openai's ChatOpenAI) with one tool: the harness of
tests/test_agent_harnesses.py. Command `python langgraph_agent.py chat|responses`."""

from __future__ import annotations

import json
import os
import sys

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def run(task: dict, client_config: dict, api: str = "chat") -> dict:
    model = ChatOpenAI(
        base_url=client_config["base_url"],
        api_key=client_config["api_key"],
        model=client_config["model"],
        use_responses_api=api == "responses",
        max_retries=0,
        max_completion_tokens=8,
    )
    graph = create_agent(model, tools=[add], system_prompt="Answer briefly; use add for sums.")
    state = graph.invoke({"messages": [("user", task["prompt"][-1]["content"])]}, {"recursion_limit": 8})
    last = state["messages"][-1]
    return {"answer": last.text if hasattr(last, "text") else str(last.content)}


if __name__ == "__main__":
    client = {
        "base_url": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ["OPENAI_API_KEY"],
        "model": os.environ["OPENAI_MODEL"],
    }
    print(json.dumps(run(json.loads(os.environ["THERMIK_TASK"]), client, sys.argv[1])))

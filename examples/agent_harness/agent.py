"""A calculator tool agent on openai-agents: the same code runs against thermik's engine (training, evaluation) and
against any API model (a teacher). thermik calls `run` once per episode (`--agent.entrypoint agent:run`)."""

from __future__ import annotations

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

INSTRUCTIONS = "Use the calculate tool, then give the answer."


@function_tool
def calculate(expression: str) -> str:
    """Evaluate arithmetic."""
    if not expression or set(expression) - set("0123456789+-*() "):
        return "error: only integers, + - * and parentheses"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # checked to digits and operators above
    except SyntaxError as exc:
        return f"error: {exc.msg}"


async def run(task: dict, client: dict) -> dict:
    """One episode: the task's question to the agent; its final output is the answer the calculator env scores
    (`<answer>N</answer>`)."""
    set_tracing_disabled(True)
    api = AsyncOpenAI(base_url=client["base_url"], api_key=client["api_key"], max_retries=0)
    model = OpenAIChatCompletionsModel(model=client["model"], openai_client=api)
    agent = Agent(name="calculator", instructions=INSTRUCTIONS, tools=[calculate], model=model)
    question = task["prompt"][-1]["content"]
    try:
        result = await Runner.run(agent, question, max_turns=3)
    except AgentsException as exc:  # turns ran out: no answer, reward 0 (the episode still trains)
        return {"reward": 0.0, "metrics": {"agent/max_turns": 1.0}, "note": str(exc)[:200]}
    return {"answer": str(result.final_output or "")}

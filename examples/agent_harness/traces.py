"""Expert traces for the SFT warm-up, in the form this agent's requests take: the calculator solver's conversations
(`thermik synthesize --env calculator`) with agent.py's instructions as the system prompt and its tools as
openai-agents sends them, so the warm-up trains on exactly the prompt the agent will send (tools rendered).

Run in the harness venv: python traces.py IN.jsonl OUT.jsonl
"""

from __future__ import annotations

import json
import sys

from agents.models.chatcmpl_converter import Converter

import agent


def main(source: str, target: str) -> None:
    tools = [Converter.tool_to_openai(tool) for tool in (agent.calculate,)]
    with open(source) as rows, open(target, "w") as out:
        for line in rows:
            row = json.loads(line)
            messages = [m for m in row["messages"] if m["role"] != "system"]
            row["messages"] = [{"role": "system", "content": agent.INSTRUCTIONS}, *messages]
            row["tools"] = tools
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Search-R1 style QA (Jin et al. 2025, arXiv:2503.09516) over the shipped corpus, with the `search` server.

The model calls `search(query, k)` / `open(doc_id)` as Hermes tool calls (instead of Search-R1's
`<search>` tags), reads the documents, and answers in `<answer>...</answer>`. Reward: exact match
after SQuAD normalisation against any of the gold answers; a turn with neither answer nor tool call
ends the episode with 0.

reward_spec: {"ground_truth": ["answer", "alias", ...]} (a single string is accepted).
"""

from __future__ import annotations

from typing import Any

from thermik.config.schema import EnvConfig
from thermik.envs.answers import exact_match, tagged_answer
from thermik.envs.base import Env, StepOutput
from thermik.envs.tool_use import ServerTools, function_schema
from thermik.tasks.search import server as search_server
from thermik.tools.mcp_pool import MCPPool

SEARCH_TOOLS: list[dict[str, Any]] = [
    function_schema(
        "search",
        "Search the documents; returns the k best.",
        {"query": {"type": "string"}, "k": {"type": "integer"}},
        ["query"],
    ),
    function_schema("open", "Read one document by id.", {"doc_id": {"type": "string"}}, ["doc_id"]),
]


class SearchEnv(Env):
    uses_mcp_pool = True

    def __init__(
        self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig, pool: MCPPool
    ) -> None:
        golds = reward_spec.get("ground_truth")
        golds = [golds] if isinstance(golds, str) else golds
        if not isinstance(golds, list) or not golds or not all(isinstance(g, str) and g.strip() for g in golds):
            raise ValueError(f"search: reward_spec['ground_truth'] must be a non-empty list of strings, got {golds!r}")
        self.golds = golds
        self.tools = SEARCH_TOOLS
        self.server = ServerTools(search_server.server_spec(), SEARCH_TOOLS, options, pool)
        self.extra_info = extra_info

    def step(self, action: str) -> StepOutput:
        raise TypeError("SearchEnv calls an MCP server asynchronously: use `await env.astep(action)`")

    async def astep(self, action: str) -> StepOutput:
        answer = tagged_answer(action)
        if answer is not None:
            correct = exact_match(answer, self.golds)
            return StepOutput([], float(correct), True, {"exact_match": correct})
        turn = await self.server.run_turn(action)
        return StepOutput(turn.observations, 0.0, not turn.found, turn.metrics())

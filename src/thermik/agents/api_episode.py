"""An agent harness against an API model (`thermik eval --policy.base_url URL --agent.command ...`): the harness
calls the model directly, so there are no token ids; the episode is its reward and its conversation.

The conversation is the `messages` (and `tools`) the harness returns in its result, in chat-completions form (tool
calls included), else the row's prompt and the harness's answer. Every episode that did not fail is written as an SFT
row `{"messages", "tools", "reward"}` to `<run dir>/sft.jsonl`, the format `thermik sft --train_path` reads
(docs/sft.md): a teacher's traces of your own harness, to warm up a small model on (docs/agents.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thermik.agents.harness_env import HarnessEnv
from thermik.agents.outcome import finish
from thermik.agents.process import Client, run_harness
from thermik.config.agent import AgentConfig
from thermik.config.schema import PolicyConfig
from thermik.rollout.agent_loop import EnvFactory
from thermik.rollout.trajectory import Trajectory


class ApiHarness:
    """A `Player` of rollout/evaluation.py: one harness episode per (row, problem, seed) against `policy`."""

    def __init__(self, cfg: AgentConfig, policy: PolicyConfig, make_env: EnvFactory, sft_path: Path) -> None:
        self.cfg, self.policy, self.make_env, self.sft_path = cfg, policy, make_env, sft_path
        sft_path.parent.mkdir(parents=True, exist_ok=True)
        sft_path.write_text("")

    async def __call__(self, row: dict[str, Any], problem: int, seed: int | None) -> Trajectory:
        env = HarnessEnv(self.make_env(row), self.cfg, row)
        try:
            client = Client(self.policy.base_url, self.policy.api_key, self.policy.model or self.cfg.model_name)
            outcome = await run_harness(self.cfg, row, client)
            result = outcome.result if isinstance(outcome.result, dict) else {}
            messages = result.get("messages") or [*row["prompt"], _answer_message(result)]
            traj = Trajectory(prompt_ids=[], group_id=problem, messages=list(messages), stop_reason="stop")
            traj.env_name, traj.num_turns = row.get("env_class", ""), _assistant_turns(messages)
            traj.timings["llm"] = outcome.elapsed
            await finish(env, row, traj, outcome)
        finally:
            await env.aclose()
        if "agent/failed" not in traj.env_metrics:
            self._write_row(traj, result.get("tools") or env.tools)
        return traj

    def _write_row(self, traj: Trajectory, tools: list[dict[str, Any]] | None) -> None:
        row = {"messages": traj.messages, **({"tools": tools} if tools else {}), "reward": traj.reward}
        with self.sft_path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _answer_message(result: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": str(result.get("answer") or "")}


def _assistant_turns(messages: list[dict[str, Any]]) -> int:
    return sum(m.get("role") == "assistant" for m in messages)

"""One evaluated or sampled episode as a JSON record: the trajectory schema of docs/evaluation.md.

SkyRL's field names (`input_prompt`, `output_response`, `score`, `stop_reason`, `env_extras`) come first, so
their readers work unchanged; thermik adds the conversation, the failure category and per-token logprobs.
"""

from __future__ import annotations

from typing import Any

from thermik.models.chat import ChatTokenizer
from thermik.rollout.failures import classify
from thermik.rollout.thinking import turn_text
from thermik.rollout.trajectory import Trajectory


def _turn_tokens(traj: Trajectory, chat: ChatTokenizer | None) -> list[dict[str, Any]]:
    """Per assistant turn: its sampled tokens as text and their rollout logprobs (for the viewer's hover)."""
    if chat is None:
        return []
    out = []
    for sample in traj.samples:  # step-wise samples in order (docs/algorithms.md)
        for start, end, _ in sample.turn_spans:
            tokens = [chat.tokenizer.decode([i], skip_special_tokens=False) for i in sample.response_ids[start:end]]
            out.append({"tokens": tokens, "logprobs": [round(x, 4) for x in sample.rollout_logprobs[start:end]]})
    return out


def _first_assistant(messages: list[dict[str, Any]]) -> int:
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))


def trajectory_record(
    traj: Trajectory,
    row: dict[str, Any] | None,
    chat: ChatTokenizer | None,
    tool_parser: str = "hermes",
    **where: Any,
) -> dict[str, Any]:
    """The record of one episode of `row` (None: the prompt is what precedes the first assistant turn); `where` adds
    its position (problem, sample, step, checkpoint)."""
    row = row or {}
    n_prompt = len(row["prompt"]) if "prompt" in row else _first_assistant(traj.messages)
    episode = traj.messages[n_prompt:]
    response_text = "".join(
        turn_text(m) if m.get("role") == "assistant" else f"\n[{m.get('role')}] {m.get('content')}\n" for m in episode
    )
    return {
        "input_prompt": traj.messages[:n_prompt],
        "output_response": response_text,
        "score": traj.reward,
        "stop_reason": str(traj.stop_reason),
        "env_extras": {"reward_spec": row.get("reward_spec", {}), "extra_info": row.get("extra_info", {})},
        "env_class": traj.env_name or row.get("env_class", ""),
        "data_source": row.get("data_source", ""),
        **where,
        "failure": "agent_failed"
        if traj.env_metrics.get("agent/failed")
        else classify(traj.messages, str(traj.stop_reason), traj.reward, n_prompt, tool_parser),
        "num_turns": traj.num_turns,
        "response_length": traj.num_generated_tokens,
        "tool_calls": traj.env_metrics.get("tool_calls", 0.0),
        "tool_failures": traj.env_metrics.get("tool_failures", 0.0),
        "messages": traj.messages,
        "turn_tokens": _turn_tokens(traj, chat),
    }

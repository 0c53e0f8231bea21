"""Per-step rollout metrics with the field's usual names (docs/architecture.md, 'Run directory')."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean, pstdev

from thermik.rollout.evaluation import SUCCESS_THRESHOLD
from thermik.rollout.trajectory import Trajectory


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    rewards = [t.reward for t in trajs]
    groups: dict[int, list[float]] = defaultdict(list)
    by_env: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        groups[t.group_id].append(t.reward)
        by_env[t.env_name or "env"].append(t.reward)
    n = len(next(iter(groups.values()))) if groups else 0
    calls = sum(t.env_metrics.get("tool_calls", 0.0) for t in trajs)
    failures = sum(t.env_metrics.get("tool_failures", 0.0) for t in trajs)
    out = {
        "reward/mean": fmean(rewards),
        "reward/std": pstdev(rewards),
        f"pass@{n}": fmean(float(max(g) >= SUCCESS_THRESHOLD) for g in groups.values()),
        "groups/zero_std_frac": fmean(float(max(g) == min(g)) for g in groups.values()),
        "response_length/mean": fmean(t.num_generated_tokens for t in trajs),
        "sequence_length/max": float(max(len(s.prompt_ids) + len(s.response_ids) for t in trajs for s in t.samples)),
        "num_turns/mean": fmean(t.num_turns for t in trajs),
        "tools/calls": calls / len(trajs),
        "tools/failure_rate": failures / calls if calls else 0.0,
        "stop/length_frac": fmean(float(t.stop_reason == "length") for t in trajs),
        "stop/max_turns_frac": fmean(float(t.stop_reason == "max_turns") for t in trajs),
        "time/llm_per_episode": fmean(t.timings["llm"] for t in trajs),
        "time/env_per_episode": fmean(t.timings["env"] for t in trajs),
    }
    if any("thinking_tokens" in t.env_metrics for t in trajs):
        thinking = sum(t.env_metrics.get("thinking_tokens", 0.0) for t in trajs)
        out["thinking/tokens_per_turn"] = thinking / max(sum(t.num_turns for t in trajs), 1)
    out["step_wise/samples_per_episode"] = fmean(len(t.samples) for t in trajs)
    for key in ("context_drops", "context_summaries"):
        if any(key in t.env_metrics for t in trajs):
            out[f"context/{key.removeprefix('context_')}"] = fmean(t.env_metrics.get(key, 0.0) for t in trajs)
    if any("verifiers_branches" in t.env_metrics for t in trajs):  # trainable branches of a verifiers trace
        out["verifiers/branches_per_episode"] = fmean(t.env_metrics.get("verifiers_branches", 0.0) for t in trajs)
    for env, rs in by_env.items():
        out[f"reward/{env}/mean"] = fmean(rs)
    for key in sorted({k for t in trajs for k in t.env_metrics if "/" in k}):  # env metrics: "<env>/<name>"
        out[key] = fmean(t.env_metrics.get(key, 0.0) for t in trajs)
    if any("agent/failed" in t.env_metrics for t in trajs):  # agent harnesses' failed episodes (thermik.agents)
        out["episodes/agent_failed"] = float(sum(t.env_metrics.get("agent/failed", 0.0) for t in trajs))
    if any("masked" in t.env_metrics for t in trajs):
        out["episodes/masked_frac"] = fmean(t.env_metrics.get("masked", 0.0) for t in trajs)
    return out

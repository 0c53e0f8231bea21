"""The rollout half of an RL run: engine, environments, prompt sampler; one step's sampling and held-out eval.

Built by `runs.build.build_run`. The local and Ray run modes hold it beside the training half; the split
orchestrator holds it alone and drives a remote inference server with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thermik.algorithms.shaping import select_groups, zero_variance_rows
from thermik.config.schema import RunConfig, SamplingConfig
from thermik.data.sampler import PromptSampler
from thermik.inference.base import InferenceEngine
from thermik.models.chat import ChatTokenizer
from thermik.rollout.agent_loop import EnvFactory, LoopLimits, rollout_rows
from thermik.rollout.evaluation import EvalResult, engine_player, evaluate, write_eval, write_records
from thermik.rollout.model_rewards import ModelRewards, merge_metrics
from thermik.rollout.records import trajectory_record
from thermik.rollout.trajectory import Trajectory


@dataclass(kw_only=True)
class RolloutContext:
    """What sampling a step and evaluating need."""

    cfg: RunConfig
    chat: ChatTokenizer
    engine: InferenceEngine
    make_env: EnvFactory
    sampler: PromptSampler | None  # None: evaluation only
    held_out: list[dict[str, Any]]
    limits: LoopLimits
    rewards: ModelRewards | None = None  # the judge / reward model of [rewards], folded into the env's rewards


async def sample_groups(ctx: RolloutContext, step: int) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
    """(all sampled trajectories, the training batch, metrics). The batch leaves out groups no model reward source
    scored (`Trajectory.unscored`). With DAPO dynamic sampling the batch keeps only groups whose rewards differ:
    `filter` samples up to dynamic_sampling_max_rounds more rounds of prompts to fill prompts_per_step groups,
    `replace` duplicates kept groups instead."""
    cfg, alg = ctx.cfg, ctx.cfg.algorithm
    want = cfg.trainer.prompts_per_step
    extra_rounds = alg.shaping.dynamic_sampling_max_rounds if alg.shaping.dynamic_sampling == "filter" else 0
    sampled: list[Trajectory] = []
    reward_metrics: list[dict[str, float]] = []
    for r in range(1 + extra_rounds):
        assert ctx.sampler is not None, "sampling training groups needs the training rows"
        rows = ctx.sampler.next_batch(want)
        seed = cfg.seed * 1_000_003 + step * 10_007 + r * 7_919
        new, metrics = await play_rows(ctx, rows, seed)
        reward_metrics.append(metrics)  # the step's problems over every round: counts summed, the longest kept
        for t in new:
            t.group_id += r * want  # group ids stay unique across rounds
        sampled += new
        if alg.shaping.dynamic_sampling == "none" or _groups_with_signal(scored(sampled)) >= want:
            break
    if alg.shaping.dynamic_sampling == "none":
        return sampled, scored(sampled), merge_metrics(reward_metrics)
    candidates = scored(sampled)
    picks = select_groups(*_rewards_and_groups(candidates), want, alg.shaping.dynamic_sampling) if candidates else []
    batch = [dataclasses.replace(candidates[i], group_id=g) for i, g in picks]
    batch = batch or candidates[-want * cfg.trainer.group_size :]
    extra = {"batch/groups_kept": float(len({g for _, g in picks})), "batch/rollout_rounds": float(r + 1)}
    return sampled, batch, {**merge_metrics(reward_metrics), **extra}


def scored(trajs: list[Trajectory]) -> list[Trajectory]:
    """The trajectories to train: those of groups the model reward sources scored."""
    return [t for t in trajs if not t.unscored]


async def play_rows(ctx: RolloutContext, rows: list[dict[str, Any]], seed: int) -> tuple[list[Trajectory], dict]:
    """A group of episodes per row on ctx.engine, with the model rewards of [rewards] folded in (their metrics). A row
    whose prompt exceeds rollout.max_input_length yields no group; `skipped_metrics` counts it."""
    cfg, too_long = ctx.cfg, list[int]()
    trajs = await rollout_rows(
        ctx.engine, ctx.make_env, ctx.chat, rows, cfg.trainer.group_size, ctx.limits, cfg.rollout.sampling, seed,
        too_long,
    )  # fmt: skip
    metrics = await ctx.rewards.apply(trajs, rows) if ctx.rewards is not None and trajs else {}
    return trajs, {**metrics, **skipped_metrics(len(rows), too_long)}


def skipped_metrics(rows: int, too_long: list[int]) -> dict[str, float]:
    """problems/played and problems/skipped (prompts over rollout.max_input_length), with the longest skipped."""
    out = {"problems/played": float(rows - len(too_long)), "problems/skipped": float(len(too_long))}
    return out | ({"problems/longest_skipped": float(max(too_long))} if too_long else {})


def _rewards_and_groups(trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([t.reward for t in trajs], dtype=torch.float32), torch.tensor([t.group_id for t in trajs])


def _groups_with_signal(trajs: list[Trajectory]) -> int:
    if not trajs:
        return 0
    rewards, group_ids = _rewards_and_groups(trajs)
    return len(set(group_ids[~zero_variance_rows(rewards, group_ids)].tolist()))


async def evaluate_held_out(ctx: RolloutContext, label: str, out_dir: Path) -> EvalResult:
    """Held-out evaluation; writes out_dir/eval_<label>.json and out_dir/trajectories/eval_<label>.jsonl."""
    cfg = ctx.cfg
    sampling = SamplingConfig(temperature=cfg.eval.temperature)
    play = engine_player(ctx.engine, ctx.make_env, ctx.chat, ctx.limits, sampling)
    result, records = await evaluate(
        play, ctx.held_out, k=cfg.eval.k, seed=cfg.seed, chat=ctx.chat, tool_parser=cfg.env.tool_parser,
        env_name=cfg.env.name,
    )  # fmt: skip
    write_eval(out_dir, label, result, records)
    return result


def dump_step_trajectories(ctx: RolloutContext, step: int, sampled: list[Trajectory]) -> None:
    """Every monitor.save_trajectories_every steps: the step's sampled episodes as trajectories/step_<n>.jsonl, each
    the Trajectory's fields plus its record (docs/evaluation.md) for the monitor's rollout viewer."""
    every = ctx.cfg.monitor.save_trajectories_every
    if not every or (step + 1) % every:
        return
    records = [
        t.to_json() | trajectory_record(t, None, ctx.chat, ctx.cfg.env.tool_parser, step=step + 1) for t in sampled
    ]
    write_records(ctx.cfg.run_dir / "trajectories" / f"step_{step + 1}.jsonl", records)

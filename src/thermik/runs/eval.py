"""`thermik eval`: the held-out evaluation (rollout/evaluation.py, the path the in-training check uses) of model.path,
of a run's checkpoints (`--steps`) or of a chat endpoint (`--policy.base_url`). docs/evaluation.md has the files.

Writes to the run directory: eval.json (scores), trajectories/eval.jsonl (one record per episode; with --steps
trajectories/eval_step_<n>.jsonl), aggregated_results.jsonl (one line per evaluated policy) and, with --steps,
eval_steps.md, eval_steps.csv and plots/eval_vs_step.png.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from thermik.agents.api_episode import ApiHarness
from thermik.assembly import components
from thermik.atomic import writable_dir
from thermik.config.loader import dump_toml
from thermik.config.schema import EvalRunConfig, SamplingConfig
from thermik.models.chat import ChatTokenizer
from thermik.monitor.plots import plot_series
from thermik.monitor.progress import print_table
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.api_policy import ApiPolicy
from thermik.rollout.context import RolloutContext, skipped_metrics
from thermik.rollout.evaluation import EvalResult, Player, engine_player, evaluate, write_records
from thermik.runs.build import build_run
from thermik.runs.verdict import PromptLimit, Verdict, eval_verdict, prompt_limit
from thermik.tools.mcp_pool import MCPPool
from thermik.training.checkpoint import CheckpointManager, load_training_state


async def _evaluate(
    cfg: EvalRunConfig,
    rows: list[dict[str, Any]],
    play: Player,
    chat: ChatTokenizer | None,
    label: str,
    verdict: Verdict,
) -> dict[str, Any]:
    """Evaluate one policy; writes its trajectories and returns its aggregated line. Its problems played and skipped
    go to the command's verdict (a warning when many were skipped)."""
    result, records = await evaluate(
        play, rows, k=cfg.eval.k, seed=cfg.seed, chat=chat, tool_parser=cfg.env.tool_parser, env_name=cfg.env.name
    )
    write_records(cfg.run_dir / "trajectories" / f"{label}.jsonl", records)
    print_result(label, result)
    verdict.observe(skipped_metrics(len(rows), [result.longest_skipped] * result.skipped), label)
    return {"label": label, **result.__dict__}


def print_result(label: str, result: EvalResult) -> None:
    """pass@1, pass@k and avg@k per env and data source, then the failure counts."""
    k, b = result.k, result.breakdown
    rows = [["all", b.get("pass@1", 0.0), b.get(f"pass@{k}", b.get("pass@1", 0.0)), b.get(f"avg@{k}", 0.0)]]
    for key in sorted(b):
        if key.endswith("/pass@1") and key.startswith(("env/", "source/")):
            name = key.removesuffix("/pass@1")
            rows.append([name, b[key], b.get(f"{name}/pass@{k}", b[key]), b[f"{name}/avg@{k}"]])
    title = f"{label}: {result.problems} problems x k={k}, {result.skipped} skipped"
    print_table(title, ["env / data source", "pass@1", f"pass@{k}", f"avg@{k}"], rows)
    failures = [[key.removeprefix("failures/"), int(v)] for key, v in b.items() if key.startswith("failures/")]
    failures.append(["(solved)", result.n - sum(count for _, count in failures)])
    print_table(f"{label}: failure categories ({result.n} episodes)", ["category", "episodes"], failures)


def _steps(cfg: EvalRunConfig) -> list[tuple[int, Path]]:
    """(step, checkpoint directory) of the checkpoints `cfg.steps` names, in step order."""
    complete = CheckpointManager(Path(cfg.checkpoints_of) / "checkpoints", keep=1).list_complete()  # reads only
    by_step = {int(d.name.removeprefix("step_")): d for d in complete}
    wanted = sorted(by_step) if cfg.steps == "all" else [int(s) for s in cfg.steps.split(",")]
    missing = [s for s in wanted if s not in by_step]
    if missing or not wanted:
        raise SystemExit(f"thermik eval: no complete checkpoint for steps {missing}; have {sorted(by_step)}")
    return [(s, by_step[s]) for s in wanted]


async def _eval_steps(cfg: EvalRunConfig, ctx: RolloutContext, policy: Any, verdict: Verdict) -> list[dict[str, Any]]:
    """Load each checkpoint into the policy, push it into the engine and evaluate; then the table and the plot."""
    play = engine_player(ctx.engine, ctx.make_env, ctx.chat, ctx.limits, _sampling(cfg))
    lines = []
    for step, directory in _steps(cfg):
        load_training_state(directory, policy, None)
        await ctx.engine.update_weights(policy.state_dict())
        label = f"eval_step_{step}"
        lines.append({"step": step, **await _evaluate(cfg, ctx.held_out, play, ctx.chat, label, verdict)})
    k = cfg.eval.k
    header = ["step", "success", f"pass@{k}", f"avg@{k}", "turns", "n"]
    table = [[r["step"], r["success"], r["breakdown"].get(f"pass@{k}", r["success"]), r["reward"], r["turns"], r["n"]]
             for r in lines]  # fmt: skip
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in row) + " |" for row in table]
    (cfg.run_dir / "eval_steps.md").write_text("\n".join(md) + "\n")
    (cfg.run_dir / "eval_steps.csv").write_text("\n".join(",".join(map(str, r)) for r in [header, *table]) + "\n")
    records = [{"step": r["step"], "eval/success": r["success"], "eval/reward": r["reward"]} for r in lines]
    plot_series(records, "step", ["eval/success", "eval/reward"], cfg.run_dir / "plots" / "eval_vs_step.png")
    return lines


def _sampling(cfg: EvalRunConfig) -> SamplingConfig:
    return SamplingConfig(temperature=cfg.eval.temperature)


async def _eval_api(cfg: EvalRunConfig) -> tuple[list[dict[str, Any]], Verdict]:
    """The policy is a chat endpoint: no local model, tokenizer or engine; envs, rows and limits as configured (the
    0 lengths: no limit here, the endpoint refuses what its model cannot hold)."""
    writable_dir(cfg.run_dir, "--output_dir")
    (cfg.run_dir / "config.toml").write_text(dump_toml(cfg))
    pool = MCPPool(log_dir=cfg.run_dir / "logs")
    _, rows = components.load_datasets(cfg.data, cfg.env, train=False)
    limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns)
    make_env = components.env_factory(cfg.env, pool)
    player = (
        ApiHarness(cfg.agent, cfg.policy, make_env, cfg.run_dir / "sft.jsonl")
        if cfg.agent.enabled
        else ApiPolicy(cfg.policy, make_env, limits, _sampling(cfg), cfg.env.tool_parser)
    )
    verdict = eval_verdict(cfg.failures, PromptLimit.of(limits, cfg.rollout))
    try:
        return [await _evaluate(cfg, rows[: cfg.eval.size], player, None, "eval", verdict)], verdict
    finally:
        if isinstance(player, ApiPolicy):
            await player.close()
        await pool.aclose()


async def _eval_local(cfg: EvalRunConfig) -> tuple[list[dict[str, Any]], Verdict]:
    """model.path (or the checkpoints of --steps) in this process's engine; a prompt limit too small for every
    prompt is refused before any episode."""
    engine = lambda policy, chat: components.build_engine(policy, chat, cfg.inference)  # noqa: E731
    run = build_run(cfg, lora=False, engine=engine, train_rows=False, learner=False)
    ctx = run.rollout
    assert ctx is not None
    try:
        verdict = eval_verdict(cfg.failures, await prompt_limit(ctx))
        if cfg.steps:
            return await _eval_steps(cfg, ctx, run.policy, verdict), verdict
        play = engine_player(ctx.engine, ctx.make_env, ctx.chat, ctx.limits, _sampling(cfg))
        return [await _evaluate(cfg, ctx.held_out, play, ctx.chat, "eval", verdict)], verdict
    finally:
        await run.close()


async def _eval(cfg: EvalRunConfig) -> dict[str, Any]:
    """Evaluate, write the results, then the verdict: NothingDoneError when no problem was scored."""
    lines, verdict = await (_eval_api(cfg) if cfg.policy.base_url else _eval_local(cfg))
    policy = cfg.policy.base_url or cfg.model.path
    with (cfg.run_dir / "aggregated_results.jsonl").open("w") as f:
        f.writelines(json.dumps({"policy": policy, **line}) + "\n" for line in lines)
    last = {k: v for k, v in lines[-1].items() if k not in ("label", "step")}
    (cfg.run_dir / "eval.json").write_text(json.dumps(last))
    verdict.conclude()
    return {"model": policy, **last}


def run_eval(cfg: EvalRunConfig) -> dict[str, Any]:
    return asyncio.run(_eval(cfg))

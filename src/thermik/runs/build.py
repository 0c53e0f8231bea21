"""The one builder every run mode uses: seed, run directory, config.toml, MCP pool, tokenizer, policy, datasets,
sampler, held-out slice, loop limits, learner. A mode asks for the parts it runs in its process.

State is composed, not inherited: a `Run` holds the shared parts, an optional `RolloutContext` (the rollout half)
and an optional `Learner` (the training half).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from thermik.agents.harness_env import harness_env_factory
from thermik.assembly import components
from thermik.assembly.hardware import check_hardware
from thermik.atomic import writable_dir
from thermik.config.schema import RunConfig, SFTConfig
from thermik.data.sampler import PromptSampler
from thermik.inference.base import InferenceEngine, InProcessKVCache
from thermik.models.chat import ChatTokenizer
from thermik.models.context_window import context_window
from thermik.models.loading import load_tokenizer
from thermik.monitor.metrics import MetricsLogger
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.context import RolloutContext
from thermik.rollout.model_rewards import build_model_rewards
from thermik.runs.resume import ConfigChange, accept_config, check_resume, resumed_message
from thermik.tools.mcp_pool import MCPPool
from thermik.training.learner import Learner, build_learner
from thermik.training.run_checkpoint import restore

EngineFactory = Callable[[torch.nn.Module | None, ChatTokenizer], InferenceEngine]
"""(policy or None when it lives elsewhere, chat tokenizer) -> the engine the rollout half samples from."""


@dataclass(kw_only=True)
class Run:
    """What one process of a run holds; the parts it does not run are None."""

    cfg: RunConfig | SFTConfig
    out_dir: Path  # this process's config.toml and metrics: the run dir, or its trainer/ or orchestrator/ subdir
    chat: ChatTokenizer
    logger: MetricsLogger
    pool: MCPPool  # the MCP servers of this process's environments; owned here, closed by `close`
    policy: torch.nn.Module | None = None
    rollout: RolloutContext | None = None
    learner: Learner | None = None
    start_step: int = 0  # steps already done (a resumed run)
    resumed: dict | None = None  # the extras of the checkpoint it resumed from
    data_position: int | None = None  # rows (RL prompts, SFT conversations) a resumed run had drawn
    config_changes: list[ConfigChange] = field(default_factory=list)  # safe changes to the saved config (resume.py)

    def accept(self) -> None:
        """The run's setup is done: its config becomes config.toml (the earlier one kept beside it), and a resumed
        run says so."""
        accept_config(self.cfg, self.out_dir)
        if self.start_step:
            print(resumed_message(self.start_step, self.data_position, self.cfg.run_dir, self.config_changes))

    async def close(self, engine: bool = True) -> None:
        """Close the logger, the engine (unless another owner closes it) and the MCP servers."""
        self.logger.close()
        if engine and self.rollout is not None:
            await self.rollout.engine.close()
        await self.pool.aclose()


def open_run(
    cfg: RunConfig | SFTConfig,
    *,
    out_dir: Path | None = None,
    load_policy: bool = True,
    lora: bool = True,
    training: bool = True,
) -> Run:
    """What every process of every mode starts with: seed, its directory, the MCP pool, the policy (or only its
    tokenizer, when the policy lives on other processes) and the metrics logger. `lora`: wrap the policy with the
    configured LoRA adapters (training does; evaluating model.path does not). `training`: a run that may resume,
    checked against its saved config first, whose config.toml `Run.accept` writes once set up; otherwise (an
    evaluation) config.toml is written now. What this machine cannot run stops it first (assembly/hardware.py)."""
    check_hardware(cfg.model if load_policy else None, getattr(cfg, "inference", None), training=training)
    out_dir = out_dir or cfg.run_dir
    changes = check_resume(cfg, out_dir) if training else []  # before anything is touched
    components.seed_everything(cfg.seed)
    out_dir = writable_dir(out_dir, "--output_dir")
    if not training:
        accept_config(cfg, out_dir)
    rl = isinstance(cfg, RunConfig)
    tool_format = cfg.env.tool_parser  # a template that ignores tools gets their schemas in this format
    if load_policy:
        policy, chat = components.load_policy(cfg.model, cfg.lora if lora else None, tool_format)
    else:
        tokenizer = load_tokenizer(cfg.model.path, cfg.model.chat_template)
        policy, chat = None, ChatTokenizer(tokenizer, tool_format, cfg.model.enable_thinking)
    logger = (
        MetricsLogger(out_dir, cfg.monitor.tensorboard, cfg.monitor.wandb_project, cfg.monitor.wandb_mode)
        if rl
        else MetricsLogger(out_dir)
    )
    pool = MCPPool(log_dir=cfg.run_dir / "logs")  # each MCP server's stderr: logs/mcp-<name>.log
    run = Run(cfg=cfg, out_dir=out_dir, chat=chat, logger=logger, pool=pool, policy=policy)
    run.config_changes = changes
    return run


def build_run(
    cfg: RunConfig,
    *,
    out_dir: Path | None = None,
    load_policy: bool = True,
    lora: bool = True,
    engine: EngineFactory | None = None,
    train_rows: bool = True,
    learner: bool = True,
    update_threads: int = 0,
) -> Run:
    """Build the parts of a run this process holds. `engine` given: the rollout half (datasets, sampler, envs,
    limits; with `train_rows` false, held-out rows only) around that engine; `learner`: the training half (needs
    the policy), restored from the newest checkpoint when checkpoint.resume finds one. The order of the steps keeps
    seeded runs reproducible."""
    # a run without training rows (an evaluation) resumes nothing: no resume check, config.toml at once
    run = open_run(cfg, out_dir=out_dir, load_policy=load_policy, lora=lora, training=train_rows)
    policy, chat = run.policy, run.chat
    rows = components.load_datasets(cfg.data, cfg.env, train_rows) if engine is not None else None
    if learner:
        assert policy is not None, "the learner needs the policy in this process"
        run.learner = build_learner(cfg, policy, chat.tokenizer, update_threads)
    if rows is not None:
        run.rollout = _rollout_context(cfg, chat, engine(policy, chat), rows, run.pool)
    if run.learner is not None:  # after the engine copied the base weights: a resumed run pushes its own at start
        run.resumed = restore(run.learner)
        if run.resumed is not None:
            resume_logger(run, run.learner.start_step, run.resumed.get("sampler"))
        else:  # a start from scratch: records of an attempt killed before its first checkpoint are not this run's
            run.logger.truncate_after(0)
    return run


def resume_logger(run: Run, start_step: int, sampler_state: dict | None) -> None:
    """A resumed run re-logs the steps after `start_step` and samples on from where it stopped."""
    run.start_step = start_step
    run.logger.truncate_after(start_step + 1)  # steps <= start_step are done and kept
    if sampler_state is not None:
        run.data_position = int(sampler_state["position"])
        if run.rollout is not None:
            run.rollout.sampler.load_state_dict(sampler_state)


def _rollout_context(
    cfg: RunConfig,
    chat: ChatTokenizer,
    engine: InferenceEngine,
    rows: tuple[list[dict] | None, list[dict]],
    pool: MCPPool,
) -> RolloutContext:
    train_rows, held_out = rows
    limits = LoopLimits.from_config(cfg.rollout, cfg.env.max_turns, context_window(cfg.model.path, chat.tokenizer))
    if isinstance(engine, InProcessKVCache):  # a too-small KV cache budget fails now, not at the first long episode
        engine.require_room(limits.max_sequence_length)
    return RolloutContext(
        cfg=cfg,
        chat=chat,
        engine=engine,
        make_env=harness_env_factory(components.env_factory(cfg.env, pool), cfg.agent, cfg.env.render_tools),
        sampler=None if train_rows is None else PromptSampler(train_rows, cfg.data.seed),
        held_out=held_out[: cfg.eval.size],
        limits=limits,
        rewards=build_model_rewards(cfg.rewards),
    )

"""Typed configuration: one frozen pydantic model per component, one file per concern.

Components are built from these models and never mutate them. Every field carries a
description so `thermik <cmd> --help` can list it with its default. This module holds the
top-level configs of each command and re-exports every section, so `thermik.config.schema`
stays the one import for users.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from thermik.config.agent import AgentConfig
from thermik.config.algorithm import AdvantageName, AlgorithmConfig, LossName, ReductionName
from thermik.config.base import Section, check_engine_precision, regex_checked
from thermik.config.data import DataColumnsConfig, DataConfig, LLMGeneratorConfig
from thermik.config.env import EnvConfig, OpenEnvConfig, ReasoningGymConfig, RepoRepairConfig, VerifiersConfig
from thermik.config.model import InferenceConfig, ModelConfig, SamplingConfig, ServerConfig
from thermik.config.rewards import DEFAULT_RUBRIC, JudgeConfig, RewardModelConfig, RewardsConfig
from thermik.config.rollout import FailuresConfig, RolloutConfig, check_lengths
from thermik.config.runtime import DistributedConfig, EvalConfig, MonitorConfig, SplitConfig
from thermik.config.trainer import (
    CheckpointConfig,
    CriticConfig,
    GuardsConfig,
    LoRAConfig,
    OptimizerConfig,
    TrainerConfig,
)

__all__ = [
    "DEFAULT_RUBRIC",
    "AdvantageName",
    "AgentConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "CriticConfig",
    "DataColumnsConfig",
    "DataConfig",
    "DistributedConfig",
    "EnvConfig",
    "EvalConfig",
    "EvalRunConfig",
    "FailuresConfig",
    "GuardsConfig",
    "InferenceConfig",
    "JudgeConfig",
    "LLMGeneratorConfig",
    "LoRAConfig",
    "LossName",
    "ModelConfig",
    "MonitorConfig",
    "OpenEnvConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "ReasoningGymConfig",
    "ReductionName",
    "RepoRepairConfig",
    "RewardModelConfig",
    "RewardsConfig",
    "Role",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SamplingConfig",
    "Section",
    "ServeConfig",
    "ServerConfig",
    "SplitConfig",
    "TrainerConfig",
    "VerifiersConfig",
    "check_engine_precision",
    "check_lengths",
    "regex_checked",
]


class RunConfig(Section):
    """`thermik rl`: GRPO on an environment."""

    name: str = Field("calculator", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent of run directories.")
    seed: int = Field(0, description="Global seed.")
    record: bool = Field(
        False,
        description="Local mode: write each step's training batch, RNG state and weight checksums to records/ "
        "(`thermik rl --record`); `thermik replay RUN --from-step S` re-runs those updates (runs/record.py). Ray "
        "and split runs refuse it.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference engine.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Your agent harness plays each episode.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Agent loop limits and sampling.")
    data: DataConfig = Field(default_factory=DataConfig, description="Datasets.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (used by advantage 'gae').")
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="LoRA adapters on the policy.")
    rewards: RewardsConfig = Field(
        default_factory=RewardsConfig, description="LLM judge and reward model, weighted with the env's reward."
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    guards: GuardsConfig = Field(default_factory=GuardsConfig, description="Engine/trainer consistency guards.")
    failures: FailuresConfig = Field(default_factory=FailuresConfig, description="Partial failures: warn or stop.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Metrics and progress.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="Ray scale-out (thermik.distributed.launch)."
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="`thermik inference @ this.toml`: the server the orchestrator uses."
    )
    split: SplitConfig = Field(default_factory=SplitConfig, description="`thermik trainer` / `thermik orchestrator`.")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @model_validator(mode="after")
    def _lengths_fit(self) -> RunConfig:
        check_lengths(self.rollout)
        if self.trainer.max_async_steps and self.algorithm.shaping.dynamic_sampling != "none":
            raise ValueError(
                "algorithm.shaping.dynamic_sampling works with synchronous training only; set it to 'none' or "
                "trainer.max_async_steps to 0"
            )
        if self.distributed.enabled:
            self._check_ray_loop()
        check_engine_precision(self.inference.precision, self.model.device)
        return self

    def _check_ray_loop(self) -> None:
        """What `thermik rl` on Ray (thermik.runs.ray) cannot run, named with the way out."""
        if self.lora.enabled and self.distributed.strategy == "fsdp2":
            raise ValueError(
                "lora.enabled with distributed.strategy='fsdp2': the engines get the adapters merged into full "
                "weights, which FSDP2's sharded parameters do not give; use distributed.strategy='ddp' with LoRA "
                "(its adapters are small) or turn lora.enabled off"
            )


class PolicyConfig(Section):
    """`thermik eval --policy.base_url URL`: an OpenAI-compatible chat endpoint as the policy under evaluation."""

    base_url: str = Field(
        "", description="Chat-completions endpoint (.../v1) evaluated on the same envs; empty: model.path in-process."
    )
    model: str = Field("", description="Model name sent to the endpoint; empty: the first one /v1/models lists.")
    api_key: str = Field("EMPTY", description="API key sent as 'Authorization: Bearer'.")
    max_concurrency: int = Field(16, ge=1, description="Most requests in flight at once.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout in seconds.")


class EvalRunConfig(RunConfig):
    """`thermik eval`: model.path, a run's checkpoints (`steps`) or a chat endpoint (`policy`); `--k N` = `--eval.k N`.

    Results go to the run directory <output_dir>/<name> (docs/evaluation.md)."""

    steps: str = Field(
        "",
        description="Evaluate checkpoints of the run in `checkpoints_of`: 'all' or step numbers '10,20'; writes "
        "eval_steps.md/.csv and plots/eval_vs_step.png.",
    )
    checkpoints_of: str = Field("", description="Run directory whose checkpoints/step_<n> `steps` evaluates.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="An API model as the policy.")

    @model_validator(mode="after")
    def _steps_need_a_run(self) -> EvalRunConfig:
        if self.steps and self.steps != "all" and not re.fullmatch(r"\d+(,\d+)*", self.steps):
            raise ValueError(f"steps: 'all' or step numbers like '10,20', got {self.steps!r}")
        if self.steps and not self.checkpoints_of:
            raise ValueError("steps: set checkpoints_of to the run directory whose checkpoints to evaluate")
        if self.steps and self.policy.base_url:
            raise ValueError("steps and policy.base_url exclude each other: checkpoints are evaluated in-process")
        return self


Role = Literal["system", "user", "assistant", "tool"]


class SFTConfig(Section):
    """`thermik sft`: supervised fine-tuning on chat conversations (docs/sft.md)."""

    name: str = Field("sft", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent of run directories.")
    seed: int = Field(0, description="Global seed (weights of new adapters, the order of the training rows).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to fine-tune.")
    train_path: str = Field(
        "", description="Conversations: .jsonl, .parquet, .arrow or a `datasets` save_to_disk directory of "
        "{'messages': [...]} rows (from `thermik synthesize`) and/or {'prompt', 'completion'} rows (strings or message "
        "lists); with columns.prompt set, that column and columns.answer (the completion) of any schema (docs/sft.md)."
    )  # fmt: skip
    train_split: str = Field("train", description="Split read from a save_to_disk DatasetDict for train_path.")
    eval_split: str = Field("test", description="Split read from a save_to_disk DatasetDict for eval_path.")
    columns: DataColumnsConfig = Field(
        default_factory=DataColumnsConfig, description="Column mapping for datasets in another schema (as in "
        "`thermik rl`; for train_path, columns.answer is the completion)."
    )  # fmt: skip
    train_roles: tuple[Role, ...] = Field(
        ("assistant",), min_length=1,
        description="Roles whose messages carry loss: 'assistant' trains every assistant turn (content and end of "
        "turn); 'system', 'user', 'tool' add the content of those messages (their template tokens never train).",
    )  # fmt: skip
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment used for the held-out check.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Limits for the held-out check.")
    max_steps: int = Field(600, ge=1, description="Most optimizer steps.")
    batch_size: int = Field(32, ge=1, description="Conversations per optimizer step.")
    micro_batch_tokens: int = Field(
        0, ge=0, description="Forward and backward in micro-batches of at most this many padded tokens (count x "
        "longest; gradients accumulate: the step is the same). 0 picks it from the model's shape so that a "
        "micro-batch's activations take about 1 GiB (docs/sft.md)."
    )  # fmt: skip
    max_length: int = Field(
        0, ge=0, description="Conversations are truncated to this many tokens; 0: the longest conversation's length, "
        "at most the model's context window (docs/sft.md)."
    )  # fmt: skip
    packing: bool = Field(
        True, description="Pack the conversations of a batch into shared rows, each attending only to itself (same "
        "per-token loss as padding, less compute on mixed lengths; docs/sft.md)."
    )  # fmt: skip
    pack_length: int = Field(0, ge=0, description="Tokens per packed row; 0 uses max_length.")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=3e-3, warmup_steps=20), description="Optimizer."
    )
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="LoRA adapters (the options of `thermik rl`).")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints every k steps; a restarted run resumes from the "
        "newest one (weights, optimizer, RNG, schedule and data position: the same run bit for bit)."
    )  # fmt: skip
    eval_every: int = Field(50, ge=0, description="Check held-out success every k steps; 0 disables the check.")
    eval_size: int = Field(64, ge=1, description="Held-out problems per check.")
    eval_path: str = Field(
        "", description="Held-out rows, read as `thermik rl` reads data.eval_path (.jsonl, .parquet, .arrow or a "
        "save_to_disk directory; columns); empty synthesizes env.name's eval split."
    )  # fmt: skip
    eval_temperature: float = Field(1.0, ge=0, description="Sampling temperature of the held-out check.")
    stop_at: float = Field(1.1, description="Stop once the held-out stop_metric reaches this; > 1 never stops.")
    stop_metric: Literal["success", "reward"] = Field("success", description="Held-out metric compared with stop_at.")
    min_steps: int = Field(0, ge=0, description="Held-out checks (and so early stops) start at this step.")
    eval_every_step_from: float = Field(
        1.1, description="Once a held-out check reaches this (stop_metric), check after every step: a metric that "
        "climbs fast is then stopped close to stop_at (docs/sft.md); > 1 keeps eval_every."
    )  # fmt: skip
    stop_window: int = Field(
        1, ge=1, description="Stop once the mean of the last k held-out checks (all of them while fewer have run) "
        "reaches stop_at: k > 1 keeps one lucky sample from stopping the run (docs/sft.md)."
    )  # fmt: skip
    progress: bool = Field(True, description="Show a rich progress bar.")
    failures: FailuresConfig = Field(default_factory=FailuresConfig, description="Partial failures: warn or stop.")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name


class ServeConfig(Section):
    """`thermik inference`: an OpenAI-compatible server over the embedded engine."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to serve.")
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig, description="Engine (backend must be embedded)."
    )
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP server.")

    @model_validator(mode="after")
    def _embedded_only(self) -> ServeConfig:
        if self.inference.backend != "embedded":
            raise ValueError("inference.backend must be 'embedded' for `thermik inference` (it serves a local model)")
        check_engine_precision(self.inference.precision, self.model.device)
        return self

"""Typed configuration: one frozen pydantic model per component.

Components are built from these models and never mutate them. Every field carries a
description so `thermik <cmd> --help` can list it with its default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """Base for every config section: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class ModelConfig(Section):
    path: str = Field("runs/models/qwen2-1m", description="Local HF model directory (weights + tokenizer).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype.")
    device: str = Field("cpu", description="torch device for trainer and embedded engine ('cpu', 'cuda', 'cuda:0').")
    seed: int = Field(0, description="Seed for weights initialisation of new heads and for torch RNGs.")


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens; 0 disables.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Drop tokens whose probability is below min_p * max prob.")


class InferenceConfig(Section):
    backend: Literal["embedded"] = Field("embedded", description="Inference engine backend.")
    max_batch_size: int = Field(256, ge=1, description="Most sequences decoded together in one batch.")
    seed: int = Field(0, description="Base seed of the engine's sampler.")


class EnvConfig(Section):
    name: str = Field("calculator", description="Environment name from the registry or a 'pkg.mod:Class' path.")
    max_turns: int = Field(4, ge=1, description="Most assistant turns per episode.")
    render_tools: bool = Field(
        True, description="Render the environment's tool schemas into the prompt; off keeps tiny-model prompts short."
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Per tool-call timeout in seconds.")
    tool_latency_s: float = Field(0.0, ge=0, description="Artificial latency added by the calculator MCP server.")
    tool_parser: Literal["hermes", "qwen3_coder", "llama3"] = Field(
        "hermes", description="Tool-call text format the model writes (thermik.tools.parsers.TOOL_PARSERS)."
    )
    tool_max_output_chars: int = Field(10_000, ge=1, description="Tool outputs are cut to this many characters.")
    mcp_servers: list[str] = Field(
        default_factory=list,
        description="MCP servers for the 'mcp' env: 'name=command args...' (stdio) or 'name=http://host:port/mcp'.",
    )
    mcp_max_servers: int = Field(4, ge=1, description="Most MCP servers one 'mcp' episode may use.")
    mcp_max_tools: int = Field(32, ge=1, description="Most tools one 'mcp' episode may expose to the model.")
    tool_groups: list[str] = Field(
        default_factory=list, description="Local tools for the 'mcp' env: 'pkg.mod:attr' of a ToolGroup or @tool."
    )


class RolloutConfig(Section):
    max_input_length: int = Field(512, ge=1, description="Longest prompt (tokens) accepted; longer rows are skipped.")
    max_generate_length: int = Field(64, ge=1, description="Most tokens sampled in one assistant turn.")
    max_sequence_length: int = Field(1024, ge=1, description="Longest prompt+response; longer is overlong (masked).")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters for training.")


class DataConfig(Section):
    train_path: str = Field("", description="Training dataset (jsonl or parquet); empty means synthesize.")
    eval_path: str = Field("", description="Held-out dataset; empty means synthesize.")
    synthetic_train_size: int = Field(2000, ge=0, description="Rows synthesized when train_path is empty.")
    synthetic_eval_size: int = Field(200, ge=0, description="Rows synthesized when eval_path is empty.")
    seed: int = Field(0, description="Seed for synthesis and shuffling.")


class AlgorithmConfig(Section):
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="Advantage estimator.")
    loss: Literal["ppo"] = Field("ppo", description="Policy loss.")
    reduction: Literal["token_mean", "sequence_mean"] = Field("token_mean", description="Loss reduction.")
    clip_low: float = Field(0.2, ge=0, description="PPO lower clip epsilon: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="PPO upper clip epsilon: ratio <= 1 + clip_high.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to the frozen reference; 0 disables it.")
    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus.")
    std_eps: float = Field(1e-6, gt=0, description="Added to the group std before dividing.")


class OptimizerConfig(Section):
    lr: float = Field(2e-4, gt=0, description="AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps, then constant.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")


class TrainerConfig(Section):
    steps: int = Field(80, ge=1, description="Number of RL steps.")
    prompts_per_step: int = Field(8, ge=1, description="Prompts sampled per step.")
    group_size: int = Field(8, ge=1, description="Samples per prompt (a group).")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per RL step (the batch is split in this many).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward; does not change gradients.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer.")


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save a checkpoint every k steps; 0 saves only at the end.")
    keep: int = Field(2, ge=1, description="Most complete checkpoints kept on disk.")
    resume: bool = Field(True, description="Resume from checkpoints/latest when the run directory has one.")


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="Evaluate on the held-out set every k steps; 0 only before and after.")
    size: int = Field(200, ge=1, description="Held-out problems evaluated.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature for evaluation.")
    before: bool = Field(True, description="Evaluate before training for the before/after table.")


class MonitorConfig(Section):
    progress: bool = Field(True, description="Show a rich progress bar.")
    save_trajectories_every: int = Field(10, ge=0, description="Dump sampled trajectories every k steps; 0 never.")
    tensorboard: bool = Field(False, description="Also write tensorboard events.")
    wandb_project: str = Field("", description="Also log to this wandb project when set.")


class RunConfig(Section):
    """`thermik rl`: GRPO on an environment."""

    name: str = Field("calculator", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent of run directories.")
    seed: int = Field(0, description="Global seed.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference engine.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Agent loop limits and sampling.")
    data: DataConfig = Field(default_factory=DataConfig, description="Datasets.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Metrics and progress.")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @model_validator(mode="after")
    def _lengths_fit(self) -> RunConfig:
        r = self.rollout
        if r.max_input_length + r.max_generate_length > r.max_sequence_length:
            raise ValueError(
                "rollout.max_sequence_length must be >= rollout.max_input_length + rollout.max_generate_length "
                f"({r.max_sequence_length} < {r.max_input_length} + {r.max_generate_length})"
            )
        return self


class SFTConfig(Section):
    """`thermik sft`: supervised fine-tuning on chat messages, loss on assistant turns only."""

    name: str = Field("sft", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent of run directories.")
    seed: int = Field(0, description="Global seed.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to fine-tune.")
    train_path: str = Field("", description="jsonl of {'messages': [...]} rows (from `thermik synthesize`).")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment used for the held-out stop check.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Limits for the held-out check.")
    max_steps: int = Field(600, ge=1, description="Most optimizer steps.")
    batch_size: int = Field(32, ge=1, description="Conversations per optimizer step.")
    max_length: int = Field(512, ge=8, description="Conversations are truncated to this many tokens.")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=3e-3, warmup_steps=20), description="Optimizer."
    )
    eval_every: int = Field(50, ge=0, description="Check held-out success every k steps; 0 disables early stop.")
    eval_size: int = Field(64, ge=1, description="Held-out problems per check.")
    eval_temperature: float = Field(1.0, ge=0, description="Sampling temperature of the held-out check.")
    stop_at: float = Field(1.1, description="Stop once the held-out stop_metric reaches this; > 1 never stops.")
    stop_metric: Literal["success", "reward"] = Field("success", description="Held-out metric compared with stop_at.")
    min_steps: int = Field(0, ge=0, description="Held-out checks (and so early stops) start at this step.")
    progress: bool = Field(True, description="Show a rich progress bar.")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

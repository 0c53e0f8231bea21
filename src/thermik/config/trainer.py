"""Config sections of the trainer: optimizer, critic, LoRA, checkpoints and guards."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from thermik.config.base import Section


class OptimizerConfig(Section):
    lr: float = Field(2e-4, gt=0, description="AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps, then constant (or decaying: decay_steps).")
    decay_steps: int = Field(
        0, ge=0, description="After warm-up, decay the rate linearly to final_lr_ratio * lr at this step, then hold it "
        "(e.g. an SFT run's max_steps); 0 keeps it constant."
    )  # fmt: skip
    final_lr_ratio: float = Field(0.1, ge=0, le=1, description="With decay_steps: the rate at its end, relative to lr.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")


class TrainerConfig(Section):
    steps: int = Field(80, ge=1, description="Number of RL steps.")
    prompts_per_step: int = Field(8, ge=1, description="Prompts sampled per step.")
    group_size: int = Field(8, ge=1, description="Samples per prompt (a group).")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per RL step (the batch is split in this many).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward; does not change gradients.")
    shared_prefix: bool = Field(
        True,
        description="Training forward runs each group's shared prompt once (Qwen2/Qwen3/Llama; same logprobs and "
        "gradients up to float rounding, less compute when prompts are long).",
    )
    packing: bool = Field(
        True,
        description="Where the shared-prompt forward does not apply (shared_prefix off, prompts not shared, another "
        "architecture), pack a micro-batch's rows together, each attending only to itself, when that takes fewer "
        "rows than padding (same logprobs up to float rounding; training/packing.py).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass: far less activation memory "
        "for about a third more compute per step (long sequences, large micro-batches; training/speed.py).",
    )
    compile: bool = Field(
        False,
        description="torch.compile each decoder layer (dynamic shapes): fuses the element-wise work; pays on a GPU at "
        "RL sizes, the first steps take the compile time (training/speed.py).",
    )
    max_async_steps: int = Field(
        0,
        ge=0,
        description="Asynchrony: how many optimizer steps rollout may run ahead of training. A sample of weight "
        "version v trains the policy of version s only if s - v <= this; 0 is synchronous, 1 one-step-off.",
    )
    stale_groups: Literal["drop", "cancel"] = Field(
        "drop",
        description="Async: in-flight groups that can no longer meet the bound are finished and dropped, or cancelled.",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer.")


class CriticConfig(Section):
    """The value model of PPO with GAE (algorithm.advantage.type = 'gae'): a copy of the policy's backbone + a linear
    head, trained with the clipped value loss by its own optimizer (training/critic.py)."""

    value_clip: float = Field(
        0.2, ge=0, description="Clipped value loss: a value moves at most this far from its old estimate; 0 = no clip."
    )
    mini_batches: int = Field(1, ge=1, description="Critic optimizer steps per RL step (the batch is split).")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=1e-3), description="The critic's own AdamW optimizer."
    )


class LoRAConfig(Section):
    """LoRA adapters on the policy (Hu et al. 2021) via PEFT; the engine receives the merged weights."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of all policy weights.")
    rank: int = Field(8, ge=1, description="LoRA rank r.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input during training.")
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1,
        description="Names of the Linear modules that get adapters.",
    )
    modules_to_save: tuple[str, ...] = Field(
        (),
        description="Modules trained in full beside the adapters (PEFT modules_to_save; a name matches every "
        "module whose name ends with it), e.g. ('norm',) for every RMSNorm weight: with frozen norms and a tied "
        "output head a small model cannot sharpen its logits (LongLoRA, Chen et al. 2023, trains norms too).",
    )


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save a checkpoint every k steps; 0 saves only at the end.")
    keep: int = Field(2, ge=1, description="Most complete checkpoints kept on disk.")
    resume: bool = Field(True, description="Resume from checkpoints/latest when the run directory has one.")
    on_write_error: Literal["stop", "continue"] = Field(
        "stop",
        description="A checkpoint that cannot be written (disk full, I/O error): 'stop' the run with a message, or "
        "'continue' training without it (a warning). Either way the previous checkpoint stays and `latest` names it.",
    )


class GuardsConfig(Section):
    """Consistency guards between engines and trainer in every run mode (assembly/guards.py; the parity probe needs
    the trainer beside the engine: not in a split run); each stops the run naming itself."""

    weight_checksum: bool = Field(
        True,
        description="After every weight sync, compare an exact checksum of each engine tensor with the tensor the "
        "trainer sent (one pass over the weights); a mismatch stops the run naming the tensors.",
    )
    parity_every: int = Field(
        0,
        ge=0,
        description="Every k steps (0: off), sample parity_tokens tokens after a fixed probe prompt with the engine, "
        "score them with the trainer, and stop the run when the logprobs differ by more than parity_max_abs_diff.",
    )
    parity_tokens: int = Field(16, ge=1, description="Tokens the parity probe samples and compares.")
    parity_max_abs_diff: float = Field(
        0.1, gt=0, description="Largest engine-vs-trainer logprob difference the parity probe accepts."
    )

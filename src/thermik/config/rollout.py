"""Config sections of the agent loop: lengths, sampling, context policy, and partial failures."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from thermik.config.base import Section
from thermik.config.model import SamplingConfig


class RolloutConfig(Section):
    max_input_length: int = Field(
        0, ge=0, description="Longest prompt (tokens) accepted; longer rows are skipped and counted "
        "(docs/reliability.md, 'Every command ends with a verdict'). 0: max_sequence_length - max_generate_length."
    )  # fmt: skip
    max_generate_length: int = Field(64, ge=1, description="Most tokens sampled in one assistant turn.")
    max_sequence_length: int = Field(
        0, ge=0, description="Longest prompt+response; longer is overlong (masked). 0: the model's context window "
        "(config.json max_position_embeddings, tokenizer model_max_length: the smaller)."
    )  # fmt: skip
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters for training.")
    step_wise: Literal["off", "on-break", "always"] = Field(
        "on-break", description="Training samples per episode (docs/algorithms.md, 'Step-wise trajectories'): 'off' "
        "(one sequence; an episode whose next prompt is not an exact extension of its tokens fails loudly), "
        "'on-break' (a new sample starts where the next prompt stops extending the tokens so far) or 'always' "
        "(every turn is its own sample)."
    )  # fmt: skip
    context: Literal["truncate-episode", "drop-oldest-observations", "summarise"] = Field(
        "truncate-episode", description="What happens when an episode outgrows its context: 'truncate-episode' "
        "(the episode stops at max_sequence_length, overlong), 'drop-oldest-observations' (when the next prompt "
        "would exceed max_input_length, the oldest tool results become context_placeholder) or 'summarise' (the "
        "policy writes a summary turn, trained like any sampled turn, that replaces the history). The last two "
        "start a new step-wise sample and need step_wise 'on-break' or 'always' (docs/algorithms.md)."
    )  # fmt: skip
    context_placeholder: str = Field(
        "[earlier output dropped]", min_length=1, description="Text replacing a dropped observation."
    )
    summary_request: str = Field(
        "Your context is full. Summarise the task and what you have found so far in a few lines; the conversation "
        "continues from your summary.",
        min_length=1,
        description="The user message that asks the policy for its summary (context 'summarise').",
    )

    @model_validator(mode="after")
    def _context_needs_step_wise(self) -> RolloutConfig:
        if self.context != "truncate-episode" and self.step_wise == "off":
            raise ValueError(
                f"rollout.context {self.context!r} rewrites the history, which breaks the token prefix: set "
                "rollout.step_wise 'on-break' (or 'always'), or rollout.context 'truncate-episode'"
            )
        return self


class FailuresConfig(Section):
    """Partial failures: a share above its limit warns once per kind, at the step it happens (docs/reliability.md)."""

    max_skipped_share: float = Field(
        0.1, ge=0, le=1, description="Share of a step's (or an evaluation's) problems that may be skipped (prompts "
        "longer than rollout.max_input_length; for `thermik sft`, conversations max_length leaves nothing to train "
        "on) before a warning."
    )  # fmt: skip
    max_failed_share: float = Field(
        0.5, ge=0, le=1, description="Share of a step's episodes that may fail (cut at rollout.max_sequence_length: "
        "overlong, their tokens not trained) before a warning."
    )  # fmt: skip
    stop: bool = Field(
        False, description="Stop the run (exit 1) at the first share above its limit instead of warning."
    )


def check_lengths(r: RolloutConfig) -> None:
    """The explicit rollout lengths leave room for a prompt and one reply (0s are resolved from the model later)."""
    if r.max_sequence_length and r.max_input_length + r.max_generate_length > r.max_sequence_length:
        raise ValueError(
            "rollout.max_sequence_length must be >= rollout.max_input_length + rollout.max_generate_length "
            f"({r.max_sequence_length} < {r.max_input_length} + {r.max_generate_length})"
        )
    if r.max_sequence_length and r.max_sequence_length <= r.max_generate_length:
        raise ValueError(
            f"rollout.max_sequence_length ({r.max_sequence_length}) leaves no room for a prompt beside "
            f"rollout.max_generate_length ({r.max_generate_length})"
        )

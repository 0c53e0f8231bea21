"""The RL algorithm's config: one section per component (`[algorithm.loss]`, `[algorithm.kl]`, ...); a section whose
`type` picks an implementation carries only that implementation's knobs (config/variants.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from thermik.config.base import Section
from thermik.config.loss import LossConfig, PPOLoss
from thermik.config.variants import variants

AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opo", "maxrl", "gae"]
LossName = Literal[
    "ppo",
    "dual_clip",
    "gspo",
    "cispo",
    "sapo",
    "clip_cov",
    "kl_cov",
    "dppo",
    "dppo_kl",
    "ipo",
    "aipo",
    "importance_sampling",
    "cross_entropy",
    "custom",
]
ReductionName = Literal["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]


class ReductionConfig(Section):
    """How the per-token loss becomes one number; flat: one knob, read by one reduction."""

    type: ReductionName = Field("token_mean", description="Loss reduction over the mini-batch.")
    constant: float = Field(
        1024.0, gt=0, description="Divisor of each sequence's token sum for type seq_mean_token_sum_norm."
    )


class AdvantageConfig(Section):
    """The advantage estimator. Flat, not variants: std_eps, gamma and lam are each read by several estimators."""

    type: AdvantageName = Field("grpo", description="Advantage estimator.")
    std_eps: float = Field(1e-6, gt=0, description="Added to a std (or mean, for maxrl) before dividing.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount for reinforce_pp and gae.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    step_rewards: Literal["episode", "per-step"] = Field(
        "episode", description="Rewards of an episode's step-wise samples: 'episode' gives every sample the episode's "
        "return and groups advantages by episode; 'per-step' scores each sample by the environment rewards from its "
        "first turn to the episode's end (docs/algorithms.md, 'Step-wise trajectories')."
    )  # fmt: skip


class KLConfig(Section):
    """The KL to the reference policy (algorithm.reference)."""

    coef: float = Field(0.0, ge=0, description="KL weight (initial value when adaptive); 0 disables KL.")
    estimator: Literal["k1", "k2", "k3", "abs"] = Field("k3", description="Per-token KL estimator.")
    mode: Literal["loss", "reward"] = Field(
        "loss", description="KL as a loss term, or subtracted from the token rewards before advantages."
    )
    controller: Literal["fixed", "adaptive"] = Field("fixed", description="Fixed or adaptive (Ziegler) KL weight.")
    target: float = Field(0.1, gt=0, description="Adaptive KL: target KL per token.")
    horizon: int = Field(10000, ge=1, description="Adaptive KL: horizon in samples.")


class ReferenceConfig(Section):
    """The reference policy of the KL term."""

    update: Literal["frozen", "copy", "ema"] = Field(
        "frozen", description="Reference policy: frozen at the start, or refreshed every `every` steps."
    )
    every: int = Field(0, ge=0, description="Refresh the reference every k RL steps (copy or ema).")
    ema_alpha: float = Field(0.1, gt=0, le=1, description="EMA refresh: ref <- (1 - alpha) ref + alpha policy.")


class TeacherConfig(Section):
    """On-policy distillation from a teacher model (docs/algorithms.md)."""

    source: str = Field(
        "", description="A local HF model directory (a frozen copy in the trainer's process) or the root "
        "'http://host:port' of an OpenAI-compatible server whose /v1/completions returns prompt_logprobs for token "
        "ids (`thermik inference`, vLLM); it must share the student's tokenizer. Empty: off."
    )  # fmt: skip
    mode: Literal["distill", "combined"] = Field(
        "distill", description="'distill': the advantage of each sampled token is -coef * (logp - teacher_logp) "
        "(pure distillation, no environment reward); 'combined': that term is added to the environment reward's "
        "advantage."
    )  # fmt: skip
    coef: float = Field(1.0, gt=0, description="Weight of the per-token reverse KL to the teacher.")
    model: str = Field("", description="Server teacher: model name to request; empty asks /v1/models.")
    api_key: str = Field("", description="Server teacher: bearer API key; empty sends none.")
    timeout_s: float = Field(120.0, gt=0, description="Server teacher: per-request timeout in seconds.")
    concurrency: int = Field(8, ge=1, description="Server teacher: requests in flight at once.")


class _RatioLevel(Section):
    level: Literal["token", "sequence"] = Field("token", description="Importance ratio per token or per sequence.")
    form: Literal["geometric", "product"] = Field(
        "geometric", description="Sequence ratio: geometric mean or product of the token ratios."
    )


class NoCorrection(Section):
    """Train on the trainer's logprobs as they are."""

    type: Literal["none"] = "none"


class TISCorrection(_RatioLevel):
    """Truncated importance sampling: weight = min(ratio, cap)."""

    type: Literal["tis"] = "tis"
    cap: float = Field(2.0, gt=0, description="Largest weight.")


class MISCorrection(_RatioLevel):
    """Masked importance sampling: tokens (or sequences) with a ratio outside [low, high] are dropped."""

    type: Literal["mis"] = "mis"
    low: float = Field(0.5, ge=0, le=1, description="Drop tokens/sequences with ratio below this.")
    high: float = Field(2.0, ge=1, description="Drop tokens/sequences with ratio above this.")


CorrectionConfig = variants(NoCorrection, TISCorrection, MISCorrection)
"""`algorithm.correction`: the rollout/trainer logprob mismatch correction, picked by `type` (default none)."""


class ShapingConfig(Section):
    """Batch and reward shaping before advantages: dynamic sampling, the overlong and length penalties."""

    dynamic_sampling: Literal["none", "filter", "replace"] = Field(
        "none", description="DAPO dynamic sampling: drop zero-variance groups, then resample (filter) or duplicate."
    )
    dynamic_sampling_max_rounds: int = Field(3, ge=0, description="Filter: most extra rollout rounds per step.")
    zero_variance_mask: bool = Field(False, description="Zero the loss mask of samples in zero-variance groups.")
    overlong_buffer: int = Field(0, ge=0, description="DAPO soft overlong penalty over the last k tokens; 0 off.")
    overlong_max_length: int = Field(
        0, ge=0, description="Response length where the overlong penalty is full; 0 = rollout.max_generate_length."
    )
    overlong_penalty_factor: float = Field(1.0, ge=0, description="Largest overlong penalty.")
    length_penalty_coef: float = Field(0.0, ge=0, description="Weight of the Kimi k1.5 length reward; 0 off.")


class HealthConfig(Section):
    """What the run does when training degenerates or produces NaN/inf."""

    halt_on_degenerate: bool = Field(False, description="Stop (not just warn) when the importance ratio is stuck.")
    degenerate_patience: int = Field(10, ge=1, description="Steps of ratio std ~ 0 with lr > 0 before acting.")
    max_nonfinite_steps: int = Field(3, ge=1, description="Fail after this many NaN/inf optimizer steps in a row.")
    on_nonfinite: Literal["skip", "halt"] = Field(
        "skip",
        description="NaN/inf in a reward, a rollout logprob (the step's update), the loss or a gradient (an "
        "optimizer step): 'skip' it (the run fails after max_nonfinite_steps in a row) or 'halt' at once. The "
        "message names the culprit; metrics health/nonfinite_rewards|rollout_logprobs, health/skipped_update.",
    )


class AlgorithmConfig(Section):
    """The RL algorithm; every name is listed with its formula and paper in docs/algorithms.md."""

    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus.")
    loss: LossConfig = Field(default_factory=PPOLoss, description="Policy loss; `type` picks it.")
    reduction: ReductionConfig = Field(default_factory=ReductionConfig, description="Loss reduction.")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantage estimator.")
    kl: KLConfig = Field(default_factory=KLConfig, description="KL to the reference policy.")
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig, description="The reference policy.")
    teacher: TeacherConfig = Field(default_factory=TeacherConfig, description="On-policy distillation.")
    correction: CorrectionConfig = Field(
        default_factory=NoCorrection, description="Rollout/trainer mismatch correction (TIS/MIS); `type` picks it."
    )
    shaping: ShapingConfig = Field(default_factory=ShapingConfig, description="Batch and reward shaping.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="NaN/inf and degenerate-ratio handling.")

"""The RL algorithm's config section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from thermik.config.base import Section

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


class AlgorithmConfig(Section):
    """The RL algorithm; every name is listed with its formula and paper in docs/algorithms.md."""

    advantage: AdvantageName = Field("grpo", description="Advantage estimator.")
    step_rewards: Literal["episode", "per-step"] = Field(
        "episode", description="Rewards of an episode's step-wise samples: 'episode' gives every sample the episode's "
        "return and groups advantages by episode; 'per-step' scores each sample by the environment rewards from its "
        "first turn to the episode's end (docs/algorithms.md, 'Step-wise trajectories')."
    )  # fmt: skip
    loss: LossName = Field("ppo", description="Policy loss; 'custom' loads algorithm.custom_loss.")
    custom_loss: str = Field("", description="Import path 'pkg.module:function' of the loss when loss = 'custom'.")
    reduction: ReductionName = Field("token_mean", description="Loss reduction over the mini-batch.")
    seq_norm_constant: float = Field(
        1024.0, gt=0, description="Divisor of each sequence's token sum for reduction seq_mean_token_sum_norm."
    )
    std_eps: float = Field(1e-6, gt=0, description="Added to a std (or mean, for maxrl) before dividing.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount for reinforce_pp and gae.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    # policy-loss hyper-parameters (names shared with thermik.algorithms.losses.LossParams)
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO lower clip epsilon: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="PPO upper clip epsilon: ratio <= 1 + clip_high.")
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound c: a token with A < 0 costs at most c|A|.")
    gspo_clip_low: float = Field(3e-4, ge=0, lt=1, description="GSPO lower clip on the sequence ratio.")
    gspo_clip_high: float = Field(4e-4, ge=0, description="GSPO upper clip on the sequence ratio.")
    cispo_clip_low: float = Field(1.0, ge=0, le=1, description="CISPO weight >= 1 - this (1 disables the bound).")
    cispo_clip_high: float = Field(4.0, ge=0, description="CISPO weight <= 1 + this.")
    sapo_tau_pos: float = Field(1.0, gt=0, description="SAPO gate temperature for tokens with A > 0.")
    sapo_tau_neg: float = Field(1.05, gt=0, description="SAPO gate temperature for tokens with A <= 0.")
    dppo_delta_low: float = Field(0.2, gt=0, description="DPPO bound on a probability (TV) or KL drop, A < 0.")
    dppo_delta_high: float = Field(0.2, gt=0, description="DPPO bound on a probability (TV) or KL rise, A > 0.")
    ratio_cap: float = Field(2.0, gt=0, description="Importance-ratio cap of the ipo and aipo losses.")
    clip_cov_ratio: float = Field(2e-4, ge=0, le=1, description="Clip-Cov: share of tokens whose gradient is cut.")
    clip_cov_lb: float = Field(1.0, description="Clip-Cov: lower covariance bound of eligible tokens.")
    clip_cov_ub: float = Field(5.0, description="Clip-Cov: upper covariance bound of eligible tokens.")
    kl_cov_ratio: float = Field(2e-4, ge=0, le=1, description="KL-Cov: share of tokens that get the KL penalty.")
    kl_cov_coef: float = Field(1.0, ge=0, description="KL-Cov: weight of |logp - old_logp| on those tokens.")
    # KL to a reference policy
    kl_coef: float = Field(0.0, ge=0, description="KL weight (initial value when adaptive); 0 disables KL.")
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = Field("k3", description="Per-token KL estimator.")
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="KL as a loss term, or subtracted from the token rewards before advantages."
    )
    kl_controller: Literal["fixed", "adaptive"] = Field("fixed", description="Fixed or adaptive (Ziegler) KL weight.")
    kl_target: float = Field(0.1, gt=0, description="Adaptive KL: target KL per token.")
    kl_horizon: int = Field(10000, ge=1, description="Adaptive KL: horizon in samples.")
    ref_update: Literal["frozen", "copy", "ema"] = Field(
        "frozen", description="Reference policy: frozen at the start, or refreshed every ref_update_every steps."
    )
    ref_update_every: int = Field(0, ge=0, description="Refresh the reference every k RL steps (copy or ema).")
    ref_ema_alpha: float = Field(0.1, gt=0, le=1, description="EMA refresh: ref <- (1 - alpha) ref + alpha policy.")
    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus.")
    # on-policy distillation (docs/algorithms.md)
    teacher: str = Field(
        "", description="On-policy distillation: a local HF model directory (a frozen copy in the trainer's process) "
        "or the root 'http://host:port' of an OpenAI-compatible server whose /v1/completions returns prompt_logprobs "
        "for token ids (`thermik inference`, vLLM); it must share the student's tokenizer. Empty: off."
    )  # fmt: skip
    teacher_mode: Literal["distill", "combined"] = Field(
        "distill", description="'distill': the advantage of each sampled token is -teacher_coef * (logp - "
        "teacher_logp) (pure distillation, no environment reward); 'combined': that term is added to the "
        "environment reward's advantage."
    )  # fmt: skip
    teacher_coef: float = Field(1.0, gt=0, description="Weight of the per-token reverse KL to the teacher.")
    teacher_model: str = Field("", description="Server teacher: model name to request; empty asks /v1/models.")
    teacher_api_key: str = Field("", description="Server teacher: bearer API key; empty sends none.")
    teacher_timeout_s: float = Field(120.0, gt=0, description="Server teacher: per-request timeout in seconds.")
    teacher_concurrency: int = Field(8, ge=1, description="Server teacher: requests in flight at once.")
    # off-policy correction between rollout and trainer logprobs
    off_policy: Literal["none", "tis", "mis"] = Field(
        "none", description="Rollout/trainer mismatch correction: truncated or masked importance sampling."
    )
    off_policy_level: Literal["token", "sequence"] = Field("token", description="Importance ratio per token/sequence.")
    off_policy_form: Literal["geometric", "product"] = Field(
        "geometric", description="Sequence ratio: geometric mean or product of the token ratios."
    )
    tis_cap: float = Field(2.0, gt=0, description="TIS: weight = min(ratio, tis_cap).")
    mis_low: float = Field(0.5, ge=0, le=1, description="MIS: drop tokens/sequences with ratio below this.")
    mis_high: float = Field(2.0, ge=1, description="MIS: drop tokens/sequences with ratio above this.")
    # batch shaping
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
    # health
    halt_on_degenerate: bool = Field(False, description="Stop (not just warn) when the importance ratio is stuck.")
    degenerate_patience: int = Field(10, ge=1, description="Steps of ratio std ~ 0 with lr > 0 before acting.")
    max_nonfinite_steps: int = Field(3, ge=1, description="Fail after this many NaN/inf optimizer steps in a row.")
    on_nonfinite: Literal["skip", "halt"] = Field(
        "skip",
        description="NaN/inf in a reward, a rollout logprob (the step's update), the loss or a gradient (an "
        "optimizer step): 'skip' it (the run fails after max_nonfinite_steps in a row) or 'halt' at once. The "
        "message names the culprit; metrics health/nonfinite_rewards|rollout_logprobs, health/skipped_update.",
    )

    @model_validator(mode="after")
    def _custom_loss_named(self) -> AlgorithmConfig:
        if (self.loss == "custom") != bool(self.custom_loss):
            raise ValueError("algorithm.custom_loss must be set exactly when algorithm.loss = 'custom'")
        return self

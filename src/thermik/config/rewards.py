"""Config sections of the reward sources beside the environment: LLM judge and reward model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from thermik.config.base import Section, regex_checked

DEFAULT_RUBRIC = (
    "You grade an assistant's answer. Conversation: [{prompt}] Answer: [{response}] Reference answer: "
    "[{ground_truth}] Give a score from 0 (wrong) to 10 (fully correct). Reply with one line: Score: <number>"
)


class JudgeConfig(Section):
    """An LLM judge behind an OpenAI-compatible chat endpoint (rollout/judge.py; docs/algorithms.md)."""

    base_url: str = Field("", description="Server root 'http://host:port' (thermik inference, vLLM, any OpenAI-"
                          "compatible API; /v1/chat/completions is appended); empty: no judge.")  # fmt: skip
    model: str = Field("", description="Model name sent with each request; empty: the first one /v1/models lists.")
    api_key: str = Field("", description="Bearer API key; empty sends none.")
    weight: float = Field(1.0, description="Weight of the judge's score in the episode's return.")
    template: str = Field(
        DEFAULT_RUBRIC, description="Rubric prompt (a Python format string) with {prompt} and {response} (the "
        "episode's messages as 'role: content' lines) and {ground_truth} (the row's reward_spec.ground_truth)."
    )  # fmt: skip
    score_pattern: str = Field(
        "(?i)score *[:=] *(-?[0-9]+(?:[.][0-9]+)?)", description="Regular expression whose group 1 (else whole "
        "match) is the score in the judge's reply; the first match counts."
    )  # fmt: skip
    max_score: float = Field(10.0, gt=0, description="The score is divided by this; a score outside [0, max] fails.")
    max_tokens: int = Field(64, ge=1, description="Most tokens of the judge's reply.")
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature.")
    timeout_s: float = Field(30.0, gt=0, description="Per-request timeout in seconds.")
    retries: int = Field(2, ge=0, description="Retries after a timeout, a connection error, 408, 429 or 5xx.")
    retry_backoff_s: float = Field(0.5, ge=0, description="Wait before the first retry, doubled for each next one.")
    concurrency: int = Field(8, ge=1, description="Requests in flight at once.")
    failure_value: float = Field(
        0.0, description="Score of an episode whose judging failed (timeout, server down, error, no score in the "
        "reply); each failure is counted in judge/failures and judge/<cause>, the first is printed. A group whose "
        "every episode failed is not trained (rewards/unscored_groups)."
    )  # fmt: skip

    @field_validator("score_pattern")
    @classmethod
    def _pattern_compiles(cls, v: str) -> str:
        return regex_checked(v)

    @field_validator("template")
    @classmethod
    def _template_fields(cls, v: str) -> str:
        try:
            v.format(prompt="", response="", ground_truth="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                "the template may use only {prompt}, {response} and {ground_truth} (double other braces): "
                f"{exc!r}"
            ) from None
        return v


class RewardModelConfig(Section):
    """A reward model: an HF sequence-classification model with one label (rollout/reward_model.py)."""

    path: str = Field("", description="Local HF model directory (AutoModelForSequenceClassification); empty: none.")
    weight: float = Field(1.0, description="Weight of its score in the episode's return.")
    normalize: Literal["none", "sigmoid"] = Field("none", description="Score = the logit, or its sigmoid.")
    max_length: int = Field(1024, ge=8, description="Inputs are cut to this many tokens from the left.")
    batch_size: int = Field(8, ge=1, description="Episodes per forward.")


class RewardsConfig(Section):
    """Model-based rewards composed with the environment's: R = env_weight * R_env + sum weight_j * score_j."""

    env_weight: float = Field(1.0, description="Weight of the environment's (rule) reward.")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="LLM judge with a rubric.")
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig, description="Reward model.")
    max_unscored_steps: int = Field(
        0, ge=0, description="Stop the run after this many steps in a row in which the judge or reward model scored "
        "no group (groups a source answered none of are never trained); 0: never stop early (a run in which a source "
        "never answered still fails at its end)."
    )  # fmt: skip

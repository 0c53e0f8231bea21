"""A small config with a discriminated-union section, as the tests of the surface, help and loader use it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from thermik.config.base import Section


class PPOLoss(Section):
    type: Literal["ppo"] = "ppo"
    clip: float = Field(0.2, gt=0, description="PPO clip range.")


class GSPOLoss(Section):
    type: Literal["gspo"] = "gspo"
    clip_low: float = Field(3e-4, gt=0, description="GSPO lower clip.")
    clip_high: float = Field(4e-4, gt=0, description="GSPO upper clip.")


Loss = Annotated[PPOLoss | GSPOLoss, Field(discriminator="type")]


class Algo(Section):
    steps: int = Field(3, description="Steps.")
    loss: Loss = Field(default_factory=PPOLoss, description="The policy loss.")


class Toy(Section):
    """`thermik toy`: a config with variants."""

    name: str = Field("toy", description="Name.")
    algorithm: Algo = Field(default_factory=Algo, description="RL algorithm.")

"""skyrl-gym environments, unchanged, inside thermik's loop: the env name `skyrl_gym:<name>`.

`make("skyrl_gym:gsm8k", reward_spec=..., extra_info=..., options=...)` builds
`skyrl_gym.make("gsm8k", env_config=options.skyrl_gym_config, extras={"reward_spec", "extra_info",
"max_turns"})` — the extras SkyRL's own generator passes — and maps its init/step/close one to one:
skyrl-gym's step returns a dict (observations, reward, done, metadata, postprocessed_action), thermik's
a StepOutput with the same first four fields. Needs the optional extra `thermik[skyrl]`.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from thermik.config.schema import EnvConfig
from thermik.envs.base import Env, Message, StepOutput


def _skyrl_gym() -> Any:
    try:
        import skyrl_gym
    except ImportError as exc:
        raise ValueError(
            f"skyrl-gym environments need the skyrl-gym package ({exc}); install it with `pip install 'thermik[skyrl]'`"
        ) from exc
    return skyrl_gym


@functools.cache
def skyrl_gym_env_class(name: str) -> type[Env]:
    """A thermik Env class wrapping skyrl-gym environment `name`; an unknown name lists the valid ones."""
    registry = _skyrl_gym().envs.registration.registry
    if name not in registry:
        raise ValueError(f"unknown skyrl-gym environment {name!r}; valid: {', '.join(sorted(registry))}")
    return type(f"SkyRLGymEnv_{name}", (SkyRLGymEnv,), {"skyrl_name": name})


class SkyRLGymEnv(Env):
    """Base of the classes skyrl_gym_env_class builds; `skyrl_name` is the skyrl-gym environment id."""

    skyrl_name: ClassVar[str] = ""

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        if not self.skyrl_name:
            raise TypeError("build skyrl-gym environments with make('skyrl_gym:<name>', ...)")
        from omegaconf import OmegaConf

        extras = {"reward_spec": reward_spec, "extra_info": extra_info, "max_turns": options.max_turns}
        try:
            self.inner = _skyrl_gym().make(
                self.skyrl_name, env_config=OmegaConf.create(dict(options.skyrl_gym_config)), extras=extras
            )
        except (AssertionError, KeyError, TypeError) as exc:
            raise ValueError(f"skyrl_gym:{self.skyrl_name}: cannot build the environment from this row: {exc}") from exc

    def init(self, prompt: list[Message]) -> tuple[list[Message], dict[str, Any]]:
        messages, info = self.inner.init(prompt)
        return list(messages), dict(info or {})

    def step(self, action: str) -> StepOutput:
        out = self.inner.step(action)
        metadata = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            metadata["postprocessed_action"] = out["postprocessed_action"]
        return StepOutput(list(out["observations"]), float(out["reward"]), bool(out["done"]), metadata)

    def close(self) -> None:
        self.inner.close()

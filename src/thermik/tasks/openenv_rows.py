"""Rows of OpenEnv environments (`openenv:pkg.mod:Class`, `openenv+ws[s]://host:port`): one per reset seed.

An OpenEnv environment makes its own task at reset, so a row is the configured system prompt plus the reset seed
(`extra_info.reset.seed`); train seeds are even and eval seeds odd, so the splits never share an episode. There
is no solver: an OpenEnv environment has no reference answer.
"""

from __future__ import annotations

from typing import Any

from thermik.config.schema import EnvConfig
from thermik.data.split import SPLITS, Split
from thermik.envs.base import Message


def check(env: str) -> None:
    if env.partition(":")[2].strip("/") in ("", "ws", "wss"):
        raise ValueError("name the OpenEnv environment: openenv:pkg.mod:Class or openenv+ws[s]://host:port")


def rows(env: str, n: int, seed: int, split: Split, options: EnvConfig) -> list[dict[str, Any]]:
    """`n` rows whose reset seeds are distinct, deterministic in (n, seed, split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    check(env)
    first = 2 * seed * 1_000_003 + SPLITS.index(split)
    return [
        {
            "data_source": env,
            "env_class": env,
            "prompt": [{"role": "system", "content": options.openenv.system_prompt}],
            "reward_spec": {},
            "extra_info": {"reset": {"seed": first + 2 * i}},
        }
        for i in range(n)
    ]


def solve(row: dict[str, Any], options: EnvConfig) -> list[Message]:
    raise ValueError(f"{row['env_class']}: OpenEnv environments have no reference solution to write SFT rows from")

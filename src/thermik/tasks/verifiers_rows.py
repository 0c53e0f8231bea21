"""Rows of `verifiers:<taskset id>` environments: the taskset's own tasks, split by content.

A taskset is a dataset, not a generator: the rows are its tasks (at most `env.verifiers.max_tasks` read), each
assigned to train or eval by `thermik.data.split.split_of` of its task data, so the splits never share a task; a
split gives at most `n` rows (fewer when the taskset has fewer). There is no solver.
"""

from __future__ import annotations

import json
from typing import Any

from thermik.config.schema import EnvConfig
from thermik.data.split import SPLITS, Split, split_of
from thermik.envs.base import Message
from thermik.envs.verifiers_env import PREFIX, bridge_for, checked, prompt_messages


def check(env: str) -> None:
    if not env.removeprefix(PREFIX):
        raise ValueError("name the verifiers taskset: verifiers:<taskset id>")


def rows(env: str, n: int, seed: int, split: Split, options: EnvConfig) -> list[dict[str, Any]]:
    """Up to `n` tasks of `split`, in the taskset's order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    check(env)
    cfg = options.verifiers
    tasks = checked(bridge_for(env.removeprefix(PREFIX), cfg).request("tasks", limit=cfg.max_tasks).result())["tasks"]
    out = []
    for task in tasks:
        key = json.dumps({k: v for k, v in task.items() if k != "idx"}, sort_keys=True)
        if split_of(key) == split and len(out) < n:
            out.append(
                {
                    "data_source": env,
                    "env_class": env,
                    "prompt": prompt_messages(task),
                    "reward_spec": {},
                    "extra_info": {"verifiers_task": task},
                }
            )
    if not out:
        raise ValueError(
            f"{env}: none of its {len(tasks)} tasks falls in the {split} split; give the taskset more tasks"
        )
    return out


def solve(row: dict[str, Any], options: EnvConfig) -> list[Message]:
    raise ValueError(f"{row['env_class']}: verifiers tasksets have no reference solution to write SFT rows from")

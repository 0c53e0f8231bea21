"""Rows of `reasoning_gym:<task>` environments, generated in this process (thermik.envs.reasoning_gym_env scores them).

Train and eval rows never share a question: each split draws from its own seed (2s for train, 2s + 1 for eval) and
keeps only the questions `thermik.data.split.split_of` assigns to it. SFT conversations answer with the task's own
answer in the configured answer format.
"""

from __future__ import annotations

from typing import Any

from thermik.config.schema import EnvConfig
from thermik.data.split import SPLITS, Split, split_of
from thermik.envs.base import Message
from thermik.envs.reasoning_gym_env import PREFIX, check_task, dataset_config, entry, format_answer, system_prompt

CANDIDATES_PER_ROW = {"train": 2, "eval": 20}
"""Entries generated per wanted row (1 in 10 questions belongs to eval), plus a fixed 100. Some tasks precompute
per entry of a dataset's size, so the size follows the request."""


def rows(env: str, n: int, seed: int, split: Split, options: EnvConfig) -> list[dict[str, Any]]:
    """`n` rows of distinct questions of `split` of `reasoning_gym:<task>`, deterministic in (task, config, n, seed,
    split)."""
    task = env.removeprefix(PREFIX)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    cfg = options.reasoning_gym
    check_task(task)
    config = dataset_config(task, cfg)
    size = CANDIDATES_PER_ROW[split] * n + 100
    source = {"task": task, "config": config, "seed": 2 * seed + SPLITS.index(split), "size": size}
    prompt = system_prompt(cfg)
    out: dict[str, dict[str, Any]] = {}  # question -> row, in generation order
    for index in range(size):
        if len(out) == n:
            break
        item = entry({**source, "index": index})
        if item["question"] in out or split_of(item["question"]) != split:
            continue
        out[item["question"]] = _row(task, item, {**source, "index": index}, prompt)
    if len(out) < n:
        raise ValueError(f"could only find {len(out)} distinct {split} questions of reasoning_gym:{task}, asked {n}")
    return list(out.values())


def _row(task: str, item: dict[str, Any], source: dict[str, Any], prompt: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": prompt}] if prompt else []
    return {
        "data_source": f"reasoning_gym/{item['metadata'].get('source_dataset', task)}",
        "env_class": PREFIX + task,
        "prompt": [*messages, {"role": "user", "content": item["question"]}],
        "reward_spec": {"ground_truth": str(item["answer"]), "reasoning_gym": source},
        "extra_info": {},
    }


def check(env: str) -> None:
    check_task(env.removeprefix(PREFIX))


def solve(row: dict[str, Any], options: EnvConfig) -> list[Message]:
    """The prompt, then the task's own answer in the configured format (the SFT target)."""
    answer = format_answer(str(row["reward_spec"]["ground_truth"]), options.reasoning_gym)
    return [*row["prompt"], {"role": "assistant", "content": answer}]

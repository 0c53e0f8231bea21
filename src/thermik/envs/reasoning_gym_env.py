"""reasoning-gym's procedural tasks as thermik environments: `reasoning_gym:<task>` and `reasoning_gym:composite`.

A row's `reward_spec["reasoning_gym"]` names where its entry comes from (task, config, seed, size, index); the env
regenerates that entry (reasoning-gym entries are a pure function of them) and scores the extracted answer with the
task's own `score_answer`, so metadata the scorer needs never goes through JSON. Single turn: one response, one
reward in [0, 1]. Needs the optional extra `thermik[reasoning-gym]`.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from thermik.config.schema import EnvConfig, ReasoningGymConfig
from thermik.envs.base import Env, StepOutput

PREFIX = "reasoning_gym:"
COMPOSITE = "composite"


def reasoning_gym() -> Any:
    """The reasoning_gym package, or an error naming the extra to install."""
    try:
        import reasoning_gym as rg
        import reasoning_gym.utils  # SYSTEM_PROMPTS
    except ImportError as exc:
        raise ValueError(
            f"reasoning_gym:<task> environments need the reasoning-gym package ({exc}); install it with "
            "`pip install 'thermik[reasoning-gym]'`"
        ) from exc
    return rg


def task_names() -> list[str]:
    return sorted(reasoning_gym().factory.DATASETS)


def check_task(task: str) -> str:
    """`task` when reasoning-gym has it; else an error listing the valid names."""
    names = task_names()
    if task not in names:
        raise ValueError(f"unknown reasoning-gym task {task!r}; valid: {', '.join(names)}")
    return task


def dataset_config(task: str, cfg: ReasoningGymConfig) -> dict[str, Any]:
    """The JSON keyword arguments of `task`'s config; for the composite, its weighted tasks with their configs."""
    if task != COMPOSITE:
        return dict(cfg.config)
    if not cfg.weights:
        raise ValueError(
            "reasoning_gym:composite needs env.reasoning_gym.weights (task name -> weight), e.g. "
            "--env.reasoning_gym.weights '{basic_arithmetic = 1, chain_sum = 1}'"
        )
    unknown = sorted(set(cfg.task_configs) - set(cfg.weights))
    if unknown:
        raise ValueError(f"env.reasoning_gym.task_configs names tasks without a weight: {', '.join(unknown)}")
    for name in cfg.weights:
        check_task(name)
    specs = [{"name": n, "weight": w, "config": dict(cfg.task_configs.get(n, {}))} for n, w in cfg.weights.items()]
    return {"datasets": specs}


def entry(source: dict[str, Any]) -> dict[str, Any]:
    """The entry a row's `reward_spec["reasoning_gym"]` names: {"question", "answer", "metadata"}."""
    return _dataset_of(source)[source["index"]]


@functools.lru_cache(maxsize=64)
def _dataset(task: str, config_json: str, seed: int, size: int) -> Any:
    rg = reasoning_gym()
    kwargs = json.loads(config_json)
    if task == COMPOSITE:
        from reasoning_gym.composite import DatasetSpec

        kwargs["datasets"] = [DatasetSpec(**spec) for spec in kwargs["datasets"]]
    try:
        return rg.create_dataset(task, seed=seed, size=size, **kwargs)
    except (TypeError, AssertionError, ValueError) as exc:
        raise ValueError(f"reasoning_gym:{task}: bad task config {kwargs}: {exc}") from exc


def system_prompt(cfg: ReasoningGymConfig) -> str:
    """The system message: a reasoning-gym prompt by name, other text verbatim, '' for none."""
    prompts = reasoning_gym().utils.SYSTEM_PROMPTS
    return prompts.get(cfg.system_prompt, cfg.system_prompt)


def extract(text: str, cfg: ReasoningGymConfig) -> str | None:
    """The answer in a response per `cfg.extraction`; None when there is none."""
    if cfg.extraction == "full":
        return text.strip() or None
    matches = re.findall(rf"<{re.escape(cfg.answer_tag)}>\s?(.*?)\s?</{re.escape(cfg.answer_tag)}>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def format_answer(answer: str, cfg: ReasoningGymConfig) -> str:
    """The text a solver writes so that `extract` reads `answer` back (SFT targets)."""
    return answer if cfg.extraction == "full" else f"<{cfg.answer_tag}>{answer}</{cfg.answer_tag}>"


class ReasoningGymEnv(Env):
    """One reasoning-gym question, one answer: reward = the task's `score_answer` of the extracted answer."""

    def __init__(self, *, reward_spec: dict[str, Any], extra_info: dict[str, Any], options: EnvConfig) -> None:
        source = reward_spec.get("reasoning_gym")
        if not isinstance(source, dict) or not {"task", "config", "seed", "size", "index"} <= set(source):
            raise ValueError(
                "a reasoning_gym row needs reward_spec.reasoning_gym = {task, config, seed, size, index}; write rows "
                "with `thermik synthesize --env reasoning_gym:<task>`"
            )
        self.source, self.cfg = source, options.reasoning_gym

    def step(self, action: str) -> StepOutput:
        item = entry(self.source)
        answer = extract(action, self.cfg)
        score = float(_dataset_of(self.source).score_answer(answer, item)) if answer is not None else 0.0
        metadata = {
            "answer_found": answer is not None,
            "task": item["metadata"].get("source_dataset", self.source["task"]),
        }
        return StepOutput([], score, True, metadata)


def _dataset_of(source: dict[str, Any]) -> Any:
    return _dataset(source["task"], json.dumps(source["config"], sort_keys=True), source["seed"], source["size"])


def reasoning_gym_env_class(task: str) -> type[Env]:
    """The env class of `reasoning_gym:<task>` (one class; the row names its task), after checking the name."""
    check_task(task)
    return ReasoningGymEnv

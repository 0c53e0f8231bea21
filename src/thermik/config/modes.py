"""Which run mode runs which option: the one table, checked when `thermik rl` (local or Ray), `thermik rl --split`,
`thermik trainer` and `thermik orchestrator` read their config (docs/architecture.md, "Options by run mode").

A mode either runs an option (`runs`: where) or refuses a config that asks for it (`refused`: why, and the way
out), with one line naming the option and the mode. Options not in the table run in every mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from thermik.config.loader import ConfigError
from thermik.config.schema import RunConfig

RunMode = Literal["local", "ray", "split"]
MODES: tuple[RunMode, ...] = ("local", "ray", "split")
COMMANDS: dict[RunMode, str] = {
    "local": "thermik rl",
    "ray": "thermik rl with distributed.enabled",
    "split": "thermik rl --split",
}


@dataclass(frozen=True)
class OptionRule:
    option: str  # the dotted key, as on the command line
    example: str  # a value that asks for the option (the table's test sets it)
    asks: Callable[[RunConfig], bool]  # whether a config asks for it
    runs: dict[RunMode, str] = field(default_factory=dict)  # mode -> where it runs
    refused: dict[RunMode, str] = field(default_factory=dict)  # mode -> why not, and what to do instead


OPTION_RULES: tuple[OptionRule, ...] = (
    OptionRule(
        "record", "true", lambda c: c.record,
        runs={"local": "runs/record.py (records/ for `thermik replay`)"},
        refused={
            "ray": "the updates run on the trainer workers, whose RNG and weights `thermik replay` cannot replay in "
            "one process; record a run without distributed.enabled",
            "split": "the trainer process does not record its updates; record a `thermik rl` run without --split",
        },
    ),
    OptionRule(
        "eval.every", "2", lambda c: c.eval.every > 0,
        runs={
            "local": "runs/loop.py", "ray": "runs/loop.py",
            "split": "the orchestrator, on the trainer's weights of that step (it waits for them)",
        },
    ),
    OptionRule(
        "trainer.stale_groups", "cancel", lambda c: c.trainer.stale_groups == "cancel",
        runs={"local": "rollout/group_producer.py", "ray": "rollout/group_producer.py"},
        refused={"split": "the orchestrator finishes every group it starts (partial rollouts) and drops only by the "
                 "staleness rule; set trainer.stale_groups 'drop'"},
    ),
    OptionRule(
        "guards.parity_every", "1", lambda c: c.guards.parity_every > 0,
        runs={"local": "assembly/guards.py", "ray": "assembly/guards.py (trainer rank 0 scores)"},
        refused={
            "split": "the probe needs the trainer's model beside the engine, and the orchestrator has only the "
            "server (the weight checksum guard still runs); set guards.parity_every 0"
        },
    ),
    OptionRule(
        "distributed.enabled", "true", lambda c: c.distributed.enabled,
        runs={"local": "it selects the Ray mode: runs/ray.py", "ray": "runs/ray.py"},
        refused={
            "split": "the split trainer is one process; run `thermik rl` without --split to train on Ray, or set "
            "distributed.enabled false",
        },
    ),
    OptionRule(
        "agent.command", "python my_agent.py", lambda c: c.agent.enabled,
        runs={
            "local": "agents/episode.py (a capture endpoint over the run's engine, in the rollout's event loop)",
            "ray": "agents/episode.py (a capture endpoint in the driver over the engine actors' pool)",
            "split": "agents/episode.py (a capture endpoint in the orchestrator over the `thermik inference` server)",
        },
    ),
    OptionRule(
        "inference.backend", "remote", lambda c: c.inference.backend != "embedded",
        runs={"local": "assembly/components.py", "ray": "assembly/components.py (in each engine actor)"},
        refused={
            "split": "the orchestrator always drives the `thermik inference` server at inference.base_url, which "
            "runs the embedded engine; leave inference.backend 'embedded'"
        },
    ),
)  # fmt: skip


def run_mode(cfg: RunConfig, split: bool) -> RunMode:
    """The mode a `thermik rl` config runs in (`split`: --split, or `thermik trainer` / `thermik orchestrator`)."""
    if split:
        return "split"
    return "ray" if cfg.distributed.enabled else "local"


def check_options(cfg: RunConfig, mode: RunMode) -> None:
    """Raise ConfigError (one line) for the first option `cfg` asks for that `mode` does not run."""
    for rule in OPTION_RULES:
        if mode in rule.refused and rule.asks(cfg):
            value = _value(cfg, rule.option)
            raise ConfigError(
                f"{rule.option} = {value} is not run in the {mode} mode ({COMMANDS[mode]}): {rule.refused[mode]}"
            )


def _value(cfg: RunConfig, option: str) -> str:
    value: object = cfg
    for part in option.split("."):
        value = getattr(value, part)
    return repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)

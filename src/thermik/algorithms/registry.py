"""The one explicit name table per kind of algorithm; the trainer looks variants up by config name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from thermik.algorithms.advantages import dr_grpo_advantages, grpo_advantages
from thermik.algorithms.kl import kl_abs, kl_k1, kl_k2, kl_k3
from thermik.algorithms.losses import ppo_clip_loss
from thermik.algorithms.reductions import sequence_mean, token_mean

ADVANTAGE_ESTIMATORS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {"grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages}
)
POLICY_LOSSES: Mapping[str, Callable[..., Any]] = MappingProxyType({"ppo": ppo_clip_loss})
REDUCTIONS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {"token_mean": token_mean, "sequence_mean": sequence_mean}
)
KL_ESTIMATORS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs}
)

TABLES: Mapping[str, Mapping[str, Callable[..., Any]]] = MappingProxyType(
    {
        "advantage": ADVANTAGE_ESTIMATORS,
        "policy_loss": POLICY_LOSSES,
        "reduction": REDUCTIONS,
        "kl": KL_ESTIMATORS,
    }
)


def get(table_name: str, name: str) -> Callable[..., Any]:
    """Look `name` up in table `table_name` ("advantage", "policy_loss", "reduction", "kl")."""
    if table_name not in TABLES:
        raise ValueError(f"unknown algorithm table {table_name!r}; valid tables: {', '.join(sorted(TABLES))}")
    table = TABLES[table_name]
    if name not in table:
        raise ValueError(f"unknown {table_name} {name!r}; valid names: {', '.join(sorted(table))}")
    return table[name]

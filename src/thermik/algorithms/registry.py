"""The one explicit name table per kind of algorithm; the trainer looks variants up by config name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from thermik.algorithms.advantages import (
    dr_grpo_advantages,
    grpo_advantages,
    maxrl_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from thermik.algorithms.cov_losses import ClipCovParams, KlCovParams, clip_cov_loss, kl_cov_loss
from thermik.algorithms.custom import CustomParams, load_custom_loss
from thermik.algorithms.gae import gae_advantages
from thermik.algorithms.is_losses import (
    CispoParams,
    RatioCapParams,
    aipo_loss,
    cispo_loss,
    cross_entropy_loss,
    importance_sampling_loss,
    ipo_loss,
)
from thermik.algorithms.kl import kl_abs, kl_k1, kl_k2, kl_k3
from thermik.algorithms.losses import (
    ClipParams,
    DppoParams,
    DualClipParams,
    GspoParams,
    NoParams,
    SapoParams,
    dppo_kl_loss,
    dppo_loss,
    dual_clip_loss,
    gspo_loss,
    ppo_clip_loss,
    sapo_loss,
)
from thermik.algorithms.reductions import prompt_mean, seq_mean_token_sum_norm, sequence_mean, token_mean

ADVANTAGE_ESTIMATORS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {
        "grpo": grpo_advantages,
        "dr_grpo": dr_grpo_advantages,
        "rloo": rloo_advantages,
        "reinforce_pp": reinforce_pp_advantages,
        "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
        "opo": opo_advantages,
        "maxrl": maxrl_advantages,
        "gae": gae_advantages,
    }
)
POLICY_LOSSES: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {
        "ppo": ppo_clip_loss,
        "dual_clip": dual_clip_loss,
        "gspo": gspo_loss,
        "cispo": cispo_loss,
        "sapo": sapo_loss,
        "clip_cov": clip_cov_loss,
        "kl_cov": kl_cov_loss,
        "dppo": dppo_loss,
        "dppo_kl": dppo_kl_loss,
        "ipo": ipo_loss,
        "aipo": aipo_loss,
        "importance_sampling": importance_sampling_loss,
        "cross_entropy": cross_entropy_loss,
    }
)
POLICY_LOSS_PARAMS: Mapping[str, type] = MappingProxyType(
    {
        "ppo": ClipParams,
        "dual_clip": DualClipParams,
        "gspo": GspoParams,
        "cispo": CispoParams,
        "sapo": SapoParams,
        "clip_cov": ClipCovParams,
        "kl_cov": KlCovParams,
        "dppo": DppoParams,
        "dppo_kl": DppoParams,
        "ipo": RatioCapParams,
        "aipo": RatioCapParams,
        "importance_sampling": NoParams,
        "cross_entropy": NoParams,
        "custom": CustomParams,
    }
)
"""Each policy loss's own parameters type (a frozen dataclass beside the loss); a loss receives only its own."""
REDUCTIONS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {
        "token_mean": token_mean,
        "sequence_mean": sequence_mean,
        "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
        "prompt_mean": prompt_mean,
    }
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

CUSTOM = "custom"
"""The policy-loss name that loads the function named by an import path instead of a table entry."""


def get(table_name: str, name: str) -> Callable[..., Any]:
    """Look `name` up in table `table_name` ("advantage", "policy_loss", "reduction", "kl")."""
    if table_name not in TABLES:
        raise ValueError(f"unknown algorithm table {table_name!r}; valid tables: {', '.join(sorted(TABLES))}")
    table = TABLES[table_name]
    if name not in table:
        extra = f", {CUSTOM} (with an import path)" if table_name == "policy_loss" else ""
        raise ValueError(f"unknown {table_name} {name!r}; valid names: {', '.join(sorted(table))}{extra}")
    return table[name]


def policy_loss(name: str, custom_path: str = "") -> Callable[..., Any]:
    """A built-in policy loss by name, or with name "custom" the function at `custom_path` ("pkg.mod:fn")."""
    if name == CUSTOM:
        return load_custom_loss(custom_path)
    return get("policy_loss", name)

"""Old config keys and their new places: one table, read by the loader (an old key fails with one line naming its
new place) and by `thermik config upgrade OLD.toml` (which rewrites a file in the new layout).

A move into a section with variants (`algorithm.loss`, `algorithm.correction`) applies only with the variants it
names: `algorithm.gspo_clip_low` is `algorithm.loss.clip_low` with `algorithm.loss.type = "gspo"`; under another
loss the old key had no effect, and the upgrade drops it with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Move:
    """Where an old dotted key went; `variants`: the `type` values of the new key's section it applies to."""

    new: str
    variants: tuple[str, ...] = ()

    def section(self) -> str:
        return self.new.rsplit(".", 1)[0]


_CLIP = ("ppo", "dual_clip", "clip_cov")
_RATIO = ("tis", "mis")

OLD_KEYS: Mapping[str, Move] = {
    "trainer.max_off_policy_steps": Move("trainer.max_async_steps"),
    "algorithm.loss": Move("algorithm.loss.type"),
    "algorithm.custom_loss": Move("algorithm.loss.path", ("custom",)),
    "algorithm.clip_low": Move("algorithm.loss.clip_low", _CLIP),
    "algorithm.clip_high": Move("algorithm.loss.clip_high", _CLIP),
    "algorithm.clip_ratio_c": Move("algorithm.loss.clip_ratio_c", ("dual_clip",)),
    "algorithm.gspo_clip_low": Move("algorithm.loss.clip_low", ("gspo",)),
    "algorithm.gspo_clip_high": Move("algorithm.loss.clip_high", ("gspo",)),
    "algorithm.cispo_clip_low": Move("algorithm.loss.clip_low", ("cispo",)),
    "algorithm.cispo_clip_high": Move("algorithm.loss.clip_high", ("cispo",)),
    "algorithm.sapo_tau_pos": Move("algorithm.loss.tau_pos", ("sapo",)),
    "algorithm.sapo_tau_neg": Move("algorithm.loss.tau_neg", ("sapo",)),
    "algorithm.dppo_delta_low": Move("algorithm.loss.delta_low", ("dppo", "dppo_kl")),
    "algorithm.dppo_delta_high": Move("algorithm.loss.delta_high", ("dppo", "dppo_kl")),
    "algorithm.ratio_cap": Move("algorithm.loss.ratio_cap", ("ipo", "aipo")),
    "algorithm.clip_cov_ratio": Move("algorithm.loss.fraction", ("clip_cov",)),
    "algorithm.clip_cov_lb": Move("algorithm.loss.cov_low", ("clip_cov",)),
    "algorithm.clip_cov_ub": Move("algorithm.loss.cov_high", ("clip_cov",)),
    "algorithm.kl_cov_ratio": Move("algorithm.loss.fraction", ("kl_cov",)),
    "algorithm.kl_cov_coef": Move("algorithm.loss.coef", ("kl_cov",)),
    "algorithm.reduction": Move("algorithm.reduction.type"),
    "algorithm.seq_norm_constant": Move("algorithm.reduction.constant"),
    "algorithm.advantage": Move("algorithm.advantage.type"),
    "algorithm.std_eps": Move("algorithm.advantage.std_eps"),
    "algorithm.gamma": Move("algorithm.advantage.gamma"),
    "algorithm.lam": Move("algorithm.advantage.lam"),
    "algorithm.step_rewards": Move("algorithm.advantage.step_rewards"),
    "algorithm.kl_coef": Move("algorithm.kl.coef"),
    "algorithm.kl_estimator": Move("algorithm.kl.estimator"),
    "algorithm.kl_mode": Move("algorithm.kl.mode"),
    "algorithm.kl_controller": Move("algorithm.kl.controller"),
    "algorithm.kl_target": Move("algorithm.kl.target"),
    "algorithm.kl_horizon": Move("algorithm.kl.horizon"),
    "algorithm.ref_update": Move("algorithm.reference.update"),
    "algorithm.ref_update_every": Move("algorithm.reference.every"),
    "algorithm.ref_ema_alpha": Move("algorithm.reference.ema_alpha"),
    "algorithm.teacher": Move("algorithm.teacher.source"),
    "algorithm.teacher_mode": Move("algorithm.teacher.mode"),
    "algorithm.teacher_coef": Move("algorithm.teacher.coef"),
    "algorithm.teacher_model": Move("algorithm.teacher.model"),
    "algorithm.teacher_api_key": Move("algorithm.teacher.api_key"),
    "algorithm.teacher_timeout_s": Move("algorithm.teacher.timeout_s"),
    "algorithm.teacher_concurrency": Move("algorithm.teacher.concurrency"),
    "algorithm.off_policy": Move("algorithm.correction.type"),
    "algorithm.off_policy_level": Move("algorithm.correction.level", _RATIO),
    "algorithm.off_policy_form": Move("algorithm.correction.form", _RATIO),
    "algorithm.tis_cap": Move("algorithm.correction.cap", ("tis",)),
    "algorithm.mis_low": Move("algorithm.correction.low", ("mis",)),
    "algorithm.mis_high": Move("algorithm.correction.high", ("mis",)),
    "algorithm.dynamic_sampling": Move("algorithm.shaping.dynamic_sampling"),
    "algorithm.dynamic_sampling_max_rounds": Move("algorithm.shaping.dynamic_sampling_max_rounds"),
    "algorithm.zero_variance_mask": Move("algorithm.shaping.zero_variance_mask"),
    "algorithm.overlong_buffer": Move("algorithm.shaping.overlong_buffer"),
    "algorithm.overlong_max_length": Move("algorithm.shaping.overlong_max_length"),
    "algorithm.overlong_penalty_factor": Move("algorithm.shaping.overlong_penalty_factor"),
    "algorithm.length_penalty_coef": Move("algorithm.shaping.length_penalty_coef"),
    "algorithm.halt_on_degenerate": Move("algorithm.health.halt_on_degenerate"),
    "algorithm.degenerate_patience": Move("algorithm.health.degenerate_patience"),
    "algorithm.max_nonfinite_steps": Move("algorithm.health.max_nonfinite_steps"),
    "algorithm.on_nonfinite": Move("algorithm.health.on_nonfinite"),
}
"""Every key of an older layout, by its full dotted name, and its new place."""

VARIANT_DEFAULTS: Mapping[str, str] = {"algorithm.loss": "ppo", "algorithm.correction": "none"}
"""The `type` a variant section has when a config does not set it (a test checks these equal the models')."""


def _or_list(names: tuple[str, ...]) -> str:
    quoted = [f'"{n}"' for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def pointer(old: str) -> str | None:
    """`old → new` (with the variant it needs) for the old dotted key `old`; None when it is not an old key."""
    move = OLD_KEYS.get(old)
    if move is None:
        return None
    where = f" with {move.section()}.type = {_or_list(move.variants)}" if move.variants else ""
    return f"{old} → {move.new}{where}"


def flatten_table(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a nested table's leaves."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update(flatten_table(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def nest_table(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested table of {dotted key: value}."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def upgrade_tree(tree: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """An old-layout config table in the new layout, and a note per old key dropped (it had no effect under the
    variant the config picks). Keys of the new layout pass unchanged."""
    flat = flatten_table(tree)
    chosen = dict(VARIANT_DEFAULTS)
    for old, value in flat.items():
        move = OLD_KEYS.get(old)
        if move is not None and move.new.endswith(".type") and move.section() in chosen:
            chosen[move.section()] = str(value)
    out: dict[str, Any] = {}
    notes: list[str] = []
    for old, value in flat.items():
        move = OLD_KEYS.get(old)
        if move is None:
            out[old] = value
        elif move.variants and chosen.get(move.section()) not in move.variants:
            notes.append(
                f"dropped {old} = {value!r}: it applies only with {move.section()}.type = {_or_list(move.variants)}"
            )
        else:
            out[move.new] = value
    return nest_table(out), notes


__all__ = ["OLD_KEYS", "VARIANT_DEFAULTS", "Move", "flatten_table", "nest_table", "pointer", "upgrade_tree"]

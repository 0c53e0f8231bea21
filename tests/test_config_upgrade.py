"""The algorithm config in sections with variants, old keys with a way forward, and `thermik config upgrade`."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import run_thermik

from thermik.algorithms.registry import POLICY_LOSS_PARAMS
from thermik.config import ConfigError, RunConfig, SFTConfig, dump_toml, load_config
from thermik.config.loader import dump_table
from thermik.config.schema import AlgorithmConfig, EvalRunConfig
from thermik.config.upgrade import OLD_KEYS, VARIANT_DEFAULTS, flatten_table, nest_table, upgrade_tree
from thermik.config.variants import variant_models
from thermik.training.loss import correction_params, loss_params

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.toml"))
LOSSES = variant_models(AlgorithmConfig.model_fields["loss"].annotation)
CORRECTIONS = variant_models(AlgorithmConfig.model_fields["correction"].annotation)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("THERMIK_"):
            monkeypatch.delenv(name)


def _section(dotted: str) -> str:
    return dotted.rsplit(".", 1)[0]


def _downgrade(tree: dict[str, Any]) -> dict[str, Any]:
    """A new-layout table in the old flat layout: the inverse of OLD_KEYS, picking the old key whose variants hold
    the variant the table chose (the opposite direction of `upgrade_tree`)."""
    flat = flatten_table(tree)
    chosen = {section: flat.get(f"{section}.type", default) for section, default in VARIANT_DEFAULTS.items()}
    inverse: dict[str, str] = {}
    for old, move in OLD_KEYS.items():
        if not move.variants or chosen.get(move.section()) in move.variants:
            inverse[move.new] = old
    return nest_table({inverse.get(key, key): value for key, value in flat.items()})


def test_algorithm_has_at_most_ten_keys_and_the_variants_their_own() -> None:
    assert len(AlgorithmConfig.model_fields) <= 10
    assert set(LOSSES) == set(POLICY_LOSS_PARAMS)
    assert set(CORRECTIONS) == {"none", "tis", "mis"}
    assert set(LOSSES["gspo"].model_fields) == {"type", "clip_low", "clip_high"}
    for section, default in VARIANT_DEFAULTS.items():
        assert getattr(AlgorithmConfig(), section.split(".")[1]).type == default


@pytest.mark.parametrize("name", sorted(set(LOSSES) - {"custom"}))
def test_each_loss_gets_its_own_params_with_the_same_defaults(name: str) -> None:
    """The config variant and the loss's dataclass beside it agree on names and defaults; a loss receives only
    its own knobs."""
    params = loss_params(LOSSES[name]())
    assert type(params) is POLICY_LOSS_PARAMS[name]
    assert params == POLICY_LOSS_PARAMS[name]()
    assert {f.name for f in dataclasses.fields(params)} == set(LOSSES[name].model_fields) - {"type"}


def test_custom_loss_gets_its_options_and_the_correction_its_knobs() -> None:
    cfg = AlgorithmConfig(loss={"type": "custom", "path": "m:f", "options": {"beta": 0.5}}, correction={"type": "mis"})
    assert loss_params(cfg.loss).options == {"beta": 0.5}
    op = correction_params(cfg.correction)
    assert (op.mode, op.low, op.high, op.level) == ("mis", 0.5, 2.0, "token")


def test_variant_knobs_and_the_default_variant(tmp_path: Path) -> None:
    cfg = load_config(RunConfig, ["--algorithm.loss.type", "gspo", "--algorithm.loss.clip_low", "1e-3"], {})
    assert (cfg.algorithm.loss.type, cfg.algorithm.loss.clip_low, cfg.algorithm.loss.clip_high) == ("gspo", 1e-3, 4e-4)
    (tmp_path / "a.toml").write_text("[algorithm.loss]\nclip_low = 0.1\n")
    assert load_config(RunConfig, ["@", str(tmp_path / "a.toml")], {}).algorithm.loss.type == "ppo"
    with pytest.raises(
        ConfigError,
        match=r"'algorithm.loss.clip_ratio_c'.*not of algorithm.loss.type = 'gspo'.*keys of 'gspo': clip_low, clip_",
    ):
        load_config(RunConfig, ["--algorithm.loss.type", "gspo", "--algorithm.loss.clip_ratio_c", "2"], {})
    with pytest.raises(
        ConfigError, match=r"algorithm.correction.type: Input tag 'tiss' does not match .* tags: 'none', 'tis', 'mis'"
    ):
        load_config(RunConfig, ["--algorithm.correction.type", "tiss"], {})
    with pytest.raises(ConfigError, match=r"Did you mean 'algorithm.loss.clip_high'"):
        load_config(RunConfig, ["--algorithm.loss.clip_hihg", "0.3"], {})


@pytest.mark.parametrize("old", sorted(OLD_KEYS))
def test_every_old_key_fails_with_one_line_naming_its_new_place(tmp_path: Path, old: str) -> None:
    move = OLD_KEYS[old]
    section, key = old.split(".", 1)
    value = '"x"'
    (tmp_path / "old.toml").write_text(f"[{section}]\n{key} = {value}\n")
    env_name = "THERMIK_" + old.upper().replace(".", "__")
    for argv, env, source in [
        (["@", str(tmp_path / "old.toml")], {}, "old.toml"),
        ([f"--{old}", "x"], {}, f"flag --{old}"),
        ([], {env_name: "x"}, f"environment variable {env_name}"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(RunConfig, argv, env)
        msg = str(err.value)
        assert "\n" not in msg and source in msg and f"{old} → {move.new}" in msg, msg
        if move.variants:
            assert f"with {move.section()}.type = " in msg and f'"{move.variants[0]}"' in msg


def test_cli_names_the_new_place_and_upgrade_writes_the_new_layout(tmp_path: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text(
        '[algorithm]\nloss = "gspo"\ngspo_clip_low = 0.01\nclip_low = 0.3\noff_policy = "tis"\ntis_cap = 1.5\n'
        "kl_coef = 0.02\n[trainer]\nmax_off_policy_steps = 1\n"
    )
    res = run_thermik("rl", "@", str(old), "--dry-run")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"thermik rl: config error: config key 'algorithm.loss' (from file '{old}') has moved: algorithm.loss → "
        "algorithm.loss.type; `thermik config upgrade FILE.toml` rewrites a file"
    ]
    new = tmp_path / "new.toml"
    res = run_thermik("config", "upgrade", str(old), "-o", str(new))
    assert res.returncode == 0, res.stderr
    assert 'dropped algorithm.clip_low = 0.3: it applies only with algorithm.loss.type = "ppo"' in res.stderr
    cfg = load_config(RunConfig, ["@", str(new)], {})
    assert cfg.algorithm.loss.model_dump() == {"type": "gspo", "clip_low": 0.01, "clip_high": 4e-4}
    assert (cfg.algorithm.correction.type, cfg.algorithm.correction.cap, cfg.algorithm.kl.coef) == ("tis", 1.5, 0.02)
    assert cfg.trainer.max_async_steps == 1
    res = run_thermik("config", "upgrade", str(tmp_path / "missing.toml"))
    assert res.returncode == 2 and "missing.toml" in res.stderr


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("correction", sorted(CORRECTIONS))
def test_every_old_key_lands_in_its_new_place(loss: str, correction: str) -> None:
    """An old config setting every old key (non-default values where they apply) validates, after the upgrade,
    to a run with each value at its new place; the keys of other variants are dropped with a note."""
    values = {
        "algorithm.loss": loss,
        "algorithm.off_policy": correction,
        "algorithm.custom_loss": "pkg.mod:fn",
        "algorithm.clip_ratio_c": 2.5,
        "algorithm.off_policy_level": "sequence",
        "algorithm.off_policy_form": "product",
        "algorithm.mis_low": 0.25,
        "algorithm.advantage": "rloo",
        "algorithm.reduction": "prompt_mean",
        "algorithm.kl_estimator": "k2",
        "algorithm.kl_mode": "reward",
        "algorithm.kl_controller": "adaptive",
        "algorithm.ref_update": "ema",
        "algorithm.teacher": "http://127.0.0.1:1",
        "algorithm.teacher_mode": "combined",
        "algorithm.teacher_model": "m",
        "algorithm.teacher_api_key": "k",
        "algorithm.step_rewards": "per-step",
        "algorithm.dynamic_sampling": "filter",
        "algorithm.zero_variance_mask": True,
        "algorithm.halt_on_degenerate": True,
        "algorithm.on_nonfinite": "halt",
        "trainer.max_off_policy_steps": 0,
    }
    for key in OLD_KEYS:  # every other (numeric) key: a valid value its default is not
        values.setdefault(key, 0.125 if key != "algorithm.gamma" else 0.5)
    for key in ("kl_horizon", "ref_update_every", "teacher_concurrency", "degenerate_patience", "max_nonfinite_steps",
                "dynamic_sampling_max_rounds", "overlong_buffer", "overlong_max_length"):  # fmt: skip
        values[f"algorithm.{key}"] = 7
    values["algorithm.mis_high"] = 1.5
    values["algorithm.ratio_cap"] = 1.5
    tree: dict[str, Any] = {}
    for dotted, value in values.items():
        section, key = dotted.split(".")
        tree.setdefault(section, {})[key] = value
    new, notes = upgrade_tree(tree)
    cfg = RunConfig.model_validate(new).model_dump()
    chosen = {"algorithm.loss": loss, "algorithm.correction": correction}
    dropped = 0
    for old, move in OLD_KEYS.items():
        if move.variants and chosen[move.section()] not in move.variants:
            dropped += 1
            assert any(note.startswith(f"dropped {old} = ") for note in notes)
            continue
        node: Any = cfg
        for part in move.new.split("."):
            node = node[part]
        assert node == values[old], old
    assert len(notes) == dropped


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_validates_the_same_in_the_old_and_the_new_layout(path: Path, tmp_path: Path) -> None:
    """Each example as written, and its full resolved config (every key), taken back to the old flat layout and
    brought forward by `upgrade_tree`, validate to the same run; the old file itself fails naming the moves."""
    model_cls = SFTConfig if "sft" in path.name else EvalRunConfig if "eval" in path.name else RunConfig
    table = tomllib.loads(path.read_text())
    if model_cls is RunConfig:  # a run file may hold the server's keys too (`thermik inference @ rl.toml`)
        table = {k: v for k, v in table.items() if k in RunConfig.model_fields}
    resolved = model_cls.model_validate(table)
    full = tomllib.loads(dump_toml(resolved))
    for tree in (table, full):
        upgraded, notes = upgrade_tree(_downgrade(tree))
        assert model_cls.model_validate(upgraded).model_dump() == resolved.model_dump()
        assert notes == []
    old = _downgrade(full)
    if "algorithm" in old:  # a run config: its algorithm keys are old ones now
        (tmp_path / "old.toml").write_text(dump_table(old))
        with pytest.raises(ConfigError, match="has moved"):
            load_config(model_cls, ["@", str(tmp_path / "old.toml")], {})

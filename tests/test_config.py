"""Config loading: precedence, errors that name the key, help text, TOML round trip, speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from thermik.config import (
    ConfigError,
    RunConfig,
    SFTConfig,
    dump_toml,
    format_help,
    help_topic,
    load_config,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_config reads os.environ by default: keep a developer's THERMIK_* variables out of these tests."""
    for name in list(os.environ):
        if name.upper().startswith("THERMIK_"):
            monkeypatch.delenv(name)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_precedence_files_then_env_then_cli(tmp_path: Path) -> None:
    a = _write(
        tmp_path / "a.toml",
        'name = "a"\n[trainer]\nsteps = 10\ngroup_size = 3\n[trainer.optimizer]\nlr = 0.1\n[eval]\nsize = 11\n',
    )
    b = _write(tmp_path / "b.toml", "[trainer]\nsteps = 20\n[trainer.optimizer]\nwarmup_steps = 5\n")
    env = {"THERMIK_TRAINER__STEPS": "30", "thermik_Eval__size": "12", "OTHER": "x"}
    cfg = load_config(RunConfig, ["@", a, f"@{b}", "--eval.size=13", "--algorithm.loss.clip_high", "0.3"], env)
    assert cfg.name == "a"
    assert cfg.trainer.steps == 30  # env beats both files
    assert cfg.trainer.group_size == 3  # deep merge keeps a's sibling key
    assert cfg.trainer.optimizer.lr == 0.1 and cfg.trainer.optimizer.warmup_steps == 5
    assert cfg.eval.size == 13  # CLI beats env
    assert cfg.algorithm.loss.clip_high == 0.3
    assert cfg.model == RunConfig().model  # untouched sections keep defaults


def test_cli_value_parsing() -> None:
    argv = [
        "--trainer.steps", "5",
        "--model.path", "runs/x",
        "--monitor.progress", "false",
        "--trainer.optimizer.betas", "[0.9, 0.95]",
        "--name", "123",  # a string field keeps digits as text
        "--algorithm.entropy_coef", "-0.01",  # a negative number is a value, not a flag
    ]  # fmt: skip
    cfg = load_config(RunConfig, argv)
    assert cfg.trainer.steps == 5 and isinstance(cfg.trainer.steps, int)
    assert cfg.model.path == "runs/x"
    assert cfg.monitor.progress is False
    assert cfg.trainer.optimizer.betas == (0.9, 0.95)
    assert cfg.name == "123"
    assert cfg.algorithm.entropy_coef == -0.01


def test_unknown_key_names_it_and_suggests() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, ["--trainer.stpes", "5"])
    msg = str(e.value)
    assert "'trainer.stpes'" in msg and "Did you mean 'trainer.steps'" in msg


def test_unknown_key_in_toml_and_env(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.toml", "[algorithm.loss]\nclip_hgh = 0.3\n")
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.clip_hgh.*bad\.toml.*algorithm\.loss\.clip_high"):
        load_config(RunConfig, ["@", bad])
    with pytest.raises(ConfigError, match=r"THERMIK_TRAINER__GROUPSIZE.*trainer\.group_size"):
        load_config(RunConfig, [], {"THERMIK_TRAINER__GROUPSIZE": "4"})


def test_runtime_switches_are_not_config_keys() -> None:
    """THERMIK_CPU_KERNELS, THERMIK_CPU_ISA and THERMIK_AUTO_PRECISION are read at run time; a config built beside
    them is the default one."""
    env = {"THERMIK_CPU_KERNELS": "0", "THERMIK_CPU_ISA": "avx2", "THERMIK_AUTO_PRECISION": "float32"}
    assert load_config(RunConfig, [], env) == load_config(RunConfig, [], {})


def test_unknown_nested_section() -> None:
    with pytest.raises(ConfigError, match=r"'traner'.*Did you mean 'trainer'"):
        load_config(RunConfig, ["--traner.steps", "5"])
    with pytest.raises(ConfigError, match=r"'trainer\.optimiser'.*'trainer\.optimizer'"):
        load_config(RunConfig, ["--trainer.optimiser.lr", "0.1"])
    with pytest.raises(ConfigError, match=r"'seed' is a value, not a section"):
        load_config(RunConfig, ["--seed.x", "1"])


def test_bad_value_names_key_and_source() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, ["--trainer.steps", "0"])
    assert "trainer.steps: Input should be greater than or equal to 1 (got 0, from flag --trainer.steps)" in str(
        e.value
    )
    with pytest.raises(ConfigError, match=r"model\.dtype: Input should be 'float32'"):
        load_config(RunConfig, ["--model.dtype", "fp8"])
    with pytest.raises(ConfigError, match=r"rollout\.max_sequence_length must be >="):
        load_config(RunConfig, ["--rollout.max_input_length", "2000", "--rollout.max_sequence_length", "1024"])


def test_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"flag '--trainer\.steps' has no value"):
        load_config(RunConfig, ["--trainer.steps"])
    with pytest.raises(ConfigError, match=r"flag '--trainer\.steps' has no value"):
        load_config(RunConfig, ["--trainer.steps", "--eval.size", "3"])
    with pytest.raises(ConfigError, match=r"config file not found: '.*missing\.toml'"):
        load_config(RunConfig, ["@", str(tmp_path / "missing.toml")])
    broken = _write(tmp_path / "broken.toml", "[trainer\nsteps = 1\n")
    with pytest.raises(ConfigError, match=r"TOML syntax error in '.*broken\.toml'"):
        load_config(RunConfig, ["@", broken])
    with pytest.raises(ConfigError, match=r"unexpected argument 'oops'"):
        load_config(RunConfig, ["oops"])
    with pytest.raises(ConfigError, match=r"'trainer' is a section"):
        load_config(RunConfig, ["--trainer", "3"])
    assert issubclass(ConfigError, ValueError)


def _leaves(model: BaseModel, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out |= _leaves(value, f"{prefix}{name}.")
        else:
            out[f"{prefix}{name}"] = value
    return out


def _expected_default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return json.dumps(list(value))  # help prints JSON: ["a", "b"], [0.9, 0.98]
    return str(value)


@pytest.mark.parametrize("model_cls", [RunConfig, SFTConfig])
def test_help_lists_every_leaf_with_default(model_cls: type[BaseModel]) -> None:
    text = format_help(model_cls)
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith("--")}
    leaves = _leaves(model_cls())
    assert set(lines) == {f"--{k}" for k in leaves}
    for key, default in leaves.items():
        assert f"default={_expected_default(default)}" in lines[f"--{key}"]
    assert "[trainer.optimizer]" in format_help(RunConfig)
    if model_cls is SFTConfig:  # its optimizer default factory differs from OptimizerConfig's own defaults
        assert "default=0.003" in lines["--optimizer.lr"]
    assert help_topic(["@", "x.toml", "--help"]) == ("", ["@", "x.toml"])
    assert help_topic(["--trainer.steps", "1"]) == (None, ["--trainer.steps", "1"])


def test_dump_load_round_trip(tmp_path: Path) -> None:
    cfg = load_config(
        RunConfig,
        [
            "--name",
            'we"ird \\ name',
            "--trainer.optimizer.betas",
            "[0.8, 0.9]",
            "--algorithm.advantage.std_eps",
            "1e-8",
        ],
        {"THERMIK_MONITOR__PROGRESS": "false"},
    )
    text = dump_toml(cfg)
    assert "[trainer.optimizer]" in text
    path = _write(tmp_path / "dumped.toml", text)
    assert load_config(RunConfig, ["@", path]) == cfg
    sft = SFTConfig(max_steps=7)
    assert load_config(SFTConfig, ["@", _write(tmp_path / "sft.toml", dump_toml(sft))]) == sft


def test_bad_key_fails_fast_without_torch() -> None:
    code = (
        "import sys\n"
        "from thermik.config import ConfigError, RunConfig, load_config\n"
        "try:\n"
        "    load_config(RunConfig, ['--trainer.stpes', '5'])\n"
        "except ConfigError as e:\n"
        "    print('ERR', e)\n"
        "print('torch' in sys.modules, 'numpy' in sys.modules)\n"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    elapsed = time.perf_counter() - start
    assert "ERR unknown config key 'trainer.stpes'" in out.stdout
    assert out.stdout.strip().endswith("False False"), out.stdout
    assert elapsed < 1.0, f"bad-key failure took {elapsed:.2f}s"


@pytest.mark.parametrize(
    ("section", "values"),
    [
        ("algorithm", {"advantage": {"type": "gae"}}),
        ("lora", {"enabled": True}),
        ("trainer", {"max_async_steps": 1}),
        ("algorithm", {"kl": {"coef": 0.1, "mode": "reward"}}),
    ],
)
def test_ray_runs_what_one_process_runs(section: str, values: dict) -> None:
    """The Ray workers run the one learner step (docs/distributed.md): these options validate in both modes."""
    from thermik.config.schema import RunConfig

    RunConfig.model_validate({"distributed": {"enabled": True}, section: values})
    RunConfig.model_validate({section: values})


def test_ray_refuses_lora_with_fsdp2_naming_the_way_out() -> None:
    from thermik.config.schema import RunConfig

    with pytest.raises(ValueError, match=r"lora.enabled with distributed.strategy='fsdp2'.*strategy='ddp'"):
        RunConfig.model_validate({"distributed": {"enabled": True, "strategy": "fsdp2"}, "lora": {"enabled": True}})
    RunConfig.model_validate({"distributed": {"enabled": True, "strategy": "ddp"}, "lora": {"enabled": True}})

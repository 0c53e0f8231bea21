"""Smoke test of benchmarks/algorithms_reverse_text.py: every row's config validates; a tiny budget runs end to end."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from thermik.config.loader import load_config
from thermik.config.schema import RunConfig

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "algorithms_reverse_text.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("algorithms_reverse_text", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["algorithms_reverse_text"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("algorithms_reverse_text", None)


def test_every_row_is_the_example_config_with_its_algorithm(bench, tmp_path) -> None:
    argv = ["--steps", "7", "--lora-steps", "9", "--out", str(tmp_path), "--lora", "--lora-modules-to-save", "norm"]
    args = bench.parse_args(argv)
    configs = {
        name: load_config(RunConfig, bench.rl_argv(args, name, tmp_path / "m"), env={})
        for name in [*bench.VARIANTS, bench.LORA_VARIANT]
    }
    assert configs["ppo_gae"].algorithm.advantage.type == "gae" and configs["gspo"].algorithm.loss.type == "gspo"
    assert configs["dr_grpo"].algorithm.advantage.type == "dr_grpo" and configs["cispo"].algorithm.loss.type == "cispo"
    assert configs["grpo_lora"].lora.enabled and not configs["grpo"].lora.enabled
    assert configs["grpo_lora"].trainer.optimizer.lr == args.lora_lr
    lora = configs.pop("grpo_lora")
    assert lora.trainer.steps == 9 and lora.lora.modules_to_save == ("norm",)  # the LoRA row has its own budget
    for cfg in configs.values():  # same budget and seed; everything else from examples/reverse_text/rl.toml
        assert (cfg.trainer.steps, cfg.seed, cfg.trainer.group_size, cfg.rollout.max_generate_length) == (7, 0, 8, 32)
    with pytest.raises(SystemExit):
        bench.parse_args(["--group", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--algorithms", "ppo_typo"])


def test_table_marks_the_target(bench) -> None:
    args = bench.parse_args(["--steps", "2"])
    rows = [bench.Result("grpo", 0.81, 0.1, 0.7, 2.0), bench.Result("rloo", 0.5, 0.0, 0.4, 2.0)]
    table = bench.format_table(rows, args)
    assert "grpo" in table.splitlines()[2] and table.splitlines()[2].endswith("yes")
    assert table.splitlines()[3].endswith("no")


@pytest.mark.slow
def test_tiny_budget_runs_every_kind_of_row(bench, tmp_path, capsys) -> None:
    argv = ["--steps", "1", "--eval-size", "2", "--prompts", "2", "--group", "2", "--train-size", "16"]
    argv += [
        "--sft-steps",
        "2",
        "--algorithms",
        "grpo",
        "ppo_gae",
        "--lora",
        "--lora-steps",
        "1",
        "--out",
        str(tmp_path),
    ]
    results = bench.main(argv)
    assert [r.name for r in results] == ["grpo", "ppo_gae", "grpo_lora"]
    assert all(0.0 <= r.reward <= 1.0 and r.step_s > 0 for r in results)
    assert (tmp_path / "sft" / "model" / "config.json").is_file()
    assert (tmp_path / "grpo_lora" / "export" / "adapter" / "adapter_config.json").is_file()
    assert "ppo_gae" in capsys.readouterr().out

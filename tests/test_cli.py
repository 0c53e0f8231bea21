"""The `thermik` command line: help, dry runs, config errors, model init, synthesize, SFT then eval.

Fast paths run as real subprocesses (what a user types); the end-to-end SFT/eval run calls `main`
in this process, where torch is already imported, to save a second of start-up per command.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import run_thermik
from pydantic import BaseModel

from thermik.cli import COMMANDS, main
from thermik.config.schema import RunConfig, SFTConfig
from thermik.models.presets import PRESETS


def _leaves(model_cls: type[BaseModel], prefix: str = "") -> dict[str, object]:
    """Dotted leaf key -> default value, for every field of the config tree (of a section with variants: the
    default variant's)."""
    out: dict[str, object] = {}
    default = model_cls()
    for name in model_cls.model_fields:
        value = getattr(default, name)
        if isinstance(value, BaseModel):
            out.update(_leaves(type(value), f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def test_top_level_help_lists_every_command() -> None:
    res = run_thermik("--help")
    assert res.returncode == 0, res.stderr
    for cmd in COMMANDS:
        assert f"thermik {cmd}" in res.stdout, cmd


def test_unknown_command_fails_listing_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "'trian'" in err and all(cmd in err for cmd in COMMANDS)


@pytest.mark.parametrize(("cmd", "model_cls"), [("rl", RunConfig), ("sft", SFTConfig)])
def test_help_all_lists_every_leaf_with_its_default(cmd: str, model_cls: type[BaseModel]) -> None:
    res = run_thermik(cmd, "--help-all")
    assert res.returncode == 0, res.stderr
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.startswith("  --")}
    leaves = _leaves(model_cls)
    assert set(lines) == {f"--{k}" for k in leaves}
    assert all("default=" in line for line in lines.values())
    if cmd == "rl":
        assert "default=80" in lines["--trainer.steps"]
        assert "default=0.28" in lines["--algorithm.loss.clip_high"]
        assert "{ppo,dual_clip,gspo," in lines["--algorithm.loss.type"]  # every variant, the default's knobs
        assert "default=[0.9, 0.98]" in lines["--trainer.optimizer.betas"]


def test_dry_run_prints_resolved_toml() -> None:
    res = run_thermik("rl", "--dry-run", "--trainer.steps", "7", "--env.name", "reverse_text")
    assert res.returncode == 0, res.stderr
    cfg = tomllib.loads(res.stdout)
    assert cfg["trainer"]["steps"] == 7
    assert cfg["env"]["name"] == "reverse_text"
    assert cfg["algorithm"]["loss"]["clip_high"] == RunConfig().algorithm.loss.clip_high  # untouched keys keep defaults
    assert RunConfig.model_validate(cfg).trainer.steps == 7  # the dump is itself a valid config


def test_dry_run_reads_environment_and_flags_win(tmp_path: Path) -> None:
    res = run_thermik("rl", "--dry-run", THERMIK_TRAINER__STEPS="9", THERMIK_EVAL__SIZE="3")
    assert res.returncode == 0, res.stderr
    cfg = tomllib.loads(res.stdout)
    assert (cfg["trainer"]["steps"], cfg["eval"]["size"]) == (9, 3)
    toml = tmp_path / "run.toml"
    toml.write_text("[trainer]\nsteps = 4\ngroup_size = 3\n")
    res = run_thermik("rl", "@", str(toml), "--dry-run", "--trainer.steps", "11", THERMIK_TRAINER__STEPS="9")
    cfg = tomllib.loads(res.stdout)
    assert (cfg["trainer"]["steps"], cfg["trainer"]["group_size"]) == (11, 3)


def test_bad_key_fails_fast_naming_the_right_key() -> None:
    t0 = time.perf_counter()
    res = run_thermik("rl", "--trainer.stepz", "3")
    elapsed = time.perf_counter() - t0
    assert res.returncode == 2
    assert "trainer.stepz" in res.stderr and "trainer.steps" in res.stderr
    assert elapsed < 1.0, f"a config typo took {elapsed:.2f} s to report (DESIGN invariant 4: under a second)"
    assert res.stdout == ""


def test_config_errors_never_import_torch() -> None:
    """Why the typo check is fast: nothing heavy is imported before the config validates."""
    code = (
        "import sys; from thermik.cli import main; "
        "rc = main(['rl', '--trainer.stepz', '3']); print(rc, 'torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.stdout.split() == ["2", "False"], res.stdout + res.stderr


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--trainer.steps", "0"], "trainer.steps"),
        (["--algorithm.advantage.type", "ppo2"], "algorithm.advantage.type"),
        (
            ["--rollout.max_generate_length", "2000", "--rollout.max_sequence_length", "1024"],
            "rollout.max_sequence_length",
        ),
        (["--trainer", "3"], "trainer"),
    ],
)
def test_bad_value_exits_2_naming_the_key(args: list[str], key: str) -> None:
    res = run_thermik("rl", *args)
    assert res.returncode == 2, res.stderr
    assert key in res.stderr
    assert "Traceback" not in res.stderr


def test_model_init_unknown_preset_lists_valid_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["model", "init", "--preset", "gpt5-1m", "--out", str(tmp_path / "m")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "gpt5-1m" in err and all(name in err for name in PRESETS)
    assert not (tmp_path / "m").exists()


def test_model_init_writes_a_loadable_model(tmp_path: Path) -> None:
    from thermik.models.loading import load_model

    assert main(["model", "init", "--preset", "llama-1m", "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "config.json").is_file() and (tmp_path / "m" / "chat_template.jinja").is_file()
    assert load_model(tmp_path / "m", device="cpu").config.model_type == "llama"


def test_synthesize_writes_rows_and_conversations(tmp_path: Path) -> None:
    res = run_thermik("synthesize", "--env", "calculator", "--n", "5", "--out", str(tmp_path / "calc"))
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (tmp_path / "calc" / "rows.jsonl").read_text().splitlines()]
    convs = [json.loads(line) for line in (tmp_path / "calc" / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and len(convs) == 5
    assert all(r["env_class"] == "calculator" and r["prompt"][-1]["role"] == "user" for r in rows)
    for row, conv in zip(rows, convs, strict=True):
        assert conv["messages"][: len(row["prompt"])] == row["prompt"]  # the solution continues the same prompt
        assert conv["messages"][-1]["role"] == "assistant"
        assert "<answer>" in conv["messages"][-1]["content"]
        assert conv["tools"], "calculator conversations carry their tool schemas"


def test_synthesize_rejects_bad_arguments(tmp_path: Path) -> None:
    res = run_thermik("synthesize", "--env", "calculator", "--n", "0", "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "--n" in res.stderr
    res = run_thermik("synthesize", "--env", "chess", "--n", "3", "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "chess" in res.stderr and "calculator" in res.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_sft_then_eval_end_to_end(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    assert main(["synthesize", "--env", "reverse_text", "--n", "16", "--out", str(data / "train")]) == 0
    assert (
        main(["synthesize", "--env", "reverse_text", "--n", "4", "--split", "eval", "--out", str(data / "eval")]) == 0
    )
    capsys.readouterr()
    sft_args = [
        "sft",
        "--model.path", str(tiny_model_dir),
        "--train_path", str(data / "train" / "sft.jsonl"),
        "--env.name", "reverse_text",
        "--output_dir", str(tmp_path / "runs"),
        "--name", "sft",
        "--max_steps", "4",
        "--batch_size", "4",
        "--eval_every", "0",
        "--progress", "false",
    ]  # fmt: skip
    assert main(sft_args) == 0
    sft_dir = tmp_path / "runs" / "sft"
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 4
    metrics = [json.loads(line) for line in (sft_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[-1]["sft/loss"] < metrics[0]["sft/loss"], "4 steps at lr 3e-3 should lower the SFT loss"
    assert tomllib.loads((sft_dir / "config.toml").read_text())["max_steps"] == 4
    model_dir = sft_dir / "model"
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    assert (model_dir / "model.safetensors").read_bytes() != (tiny_model_dir / "model.safetensors").read_bytes()

    eval_args = [
        "eval",
        "--model.path", str(model_dir),
        "--env.name", "reverse_text",
        "--env.max_turns", "1",
        "--data.eval_path", str(data / "eval" / "rows.jsonl"),
        "--data.synthetic_train_size", "0",
        "--eval.size", "4",
        "--rollout.max_generate_length", "16",
        "--output_dir", str(tmp_path / "runs"),
        "--name", "eval",
    ]  # fmt: skip
    assert main(eval_args) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = json.loads((tmp_path / "runs" / "eval" / "eval.json").read_text())
    assert printed["model"] == str(model_dir)
    assert written["n"] == 4 and printed["n"] == 4
    assert 0.0 <= written["reward"] <= 1.0 and written["turns"] == 1.0
    assert {k: printed[k] for k in written} == written

